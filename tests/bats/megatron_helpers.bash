# SPDX-License-Identifier: MIT
# Shared by the megatron*.bats files (load helpers, then megatron_helpers):
# the two oracles of a Megatron mount and the mounts they compare.
#  - every view against the truth that lib/megatron_truth.py stacks from a
#    fixture's per-layer truth (lib/check_views.py);
#  - megatron/'s legacy per-rank files against the files
#    tools/fixtures/gen_megatron.py legacy writes for the same target
#    (lib/check_megatron_legacy.py, torch.load-ed, key by key).
# Mounts made here are listed in MEG_ALL; call megatron_teardown from the
# file's teardown, before teardown_ff.

MEG_VIEWS=$FLEXFS_SRC/tests/bats/lib/check_views.py
MEG_TRUTH=$FLEXFS_SRC/tests/bats/lib/megatron_truth.py
MEG_LEGACY=$FLEXFS_SRC/tests/bats/lib/check_megatron_legacy.py
MEG_STUB=$FLEXFS_SRC/tools/fixtures/megatron_stub
MEG_ALL=()
MEG_DIRS=()
MEG_PIDS=()
MEG_ERRS=()

# megatron_views FIXTURE SRC TP [PP]: every view of SRC mounted at tp=TP
# (and pp=PP when given) equals the truth of FIXTURE (a fixture directory),
# stacked once per test; unmounted cleanly, the daemon said nothing.
megatron_views() {
	local fx=$1 src=$2 tp=$3 pp=${4:-} truth=$BATS_TEST_TMPDIR/truth-${1##*/}

	[ -d "$truth" ] || /usr/bin/python3 "$MEG_TRUTH" "$fx" "$truth"
	mount_ff "$src" "$MNT" "tp=$tp${pp:+,pp=$pp}"
	run /usr/bin/python3 "$MEG_VIEWS" -q --mount "$MNT" --truth "$truth" \
		--tp "$tp" --pp "${pp:-1}"
	echo "${fx##*/} tp=$tp pp=${pp:-1}: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

# megatron_mount SRC DIR OPTS: mount SRC on DIR (created), one of the
# mounts megatron_unmount_all ends.
megatron_mount() {
	mkdir -p "$2"
	mount_ff "$1" "$2" "$3"
	MEG_ALL+=("$2")
	MEG_DIRS+=("$2")
	MEG_PIDS+=("$FF_PID")
	MEG_ERRS+=("$FF_ERR")
}

# megatron_unmount_all: unmount every megatron_mount since the last call;
# fails unless each daemon exited 0 having said nothing on stderr.
megatron_unmount_all() {
	local i bad=0

	for i in "${!MEG_DIRS[@]}"; do
		FF_PID=${MEG_PIDS[$i]}
		FF_RC=
		unmount_ff "${MEG_DIRS[$i]}" || bad=1
		if [[ $FF_RC != 0 || -s ${MEG_ERRS[$i]} ]]; then
			echo "${MEG_DIRS[$i]}: daemon exit '$FF_RC', stderr:" >&2
			cat "${MEG_ERRS[$i]}" >&2
			bad=1
		fi
	done
	FF_PID=
	MEG_DIRS=()
	MEG_PIDS=()
	MEG_ERRS=()
	return "$bad"
}

# megatron_legacy_run MNT EXPECTED [MNT EXPECTED]...: the legacy checker on
# each MNT/megatron against its oracle directory, in one run (bats's
# $status and $output).
megatron_legacy_run() {
	local args=()

	while (($# >= 2)); do
		args+=(--mount "$1/megatron" --expected "$2")
		shift 2
	done
	run /usr/bin/python3 "$MEG_LEGACY" "${args[@]}" --stub "$MEG_STUB"
	echo "$output"
}

# megatron_legacy_passed: the last checker run passed every comparison.
megatron_legacy_passed() {
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
}

# megatron_legacy SRC|OPTS|EXPECTED...: every SRC mounted with its OPTS at
# once, each megatron/ compared with its EXPECTED oracle in one checker
# run, every mount ended cleanly (exit 0, nothing on stderr).
megatron_legacy() {
	local t src opts exp d pairs=()

	for t in "$@"; do
		IFS='|' read -r src opts exp <<<"$t"
		d=$BATS_TEST_TMPDIR/meg${#MEG_ALL[@]}
		megatron_mount "$src" "$d" "$opts"
		pairs+=("$d" "$exp")
	done
	megatron_legacy_run "${pairs[@]}"
	megatron_unmount_all
	megatron_legacy_passed
}

# megatron_teardown: lazily unmount whatever megatron_mount left mounted.
megatron_teardown() {
	local d

	for d in "${MEG_ALL[@]}"; do
		mountpoint -q "$d" && fusermount3 -u -z "$d"
	done
	MEG_ALL=()
}

# copy_common SRC DIR STATEMENT: SRC (an iteration directory) copied to
# DIR, its common.pt rewritten after the Python STATEMENT acts on c, the
# loaded dict (the stub modules stand for Megatron's classes).
copy_common() {
	cp -r "$1" "$2"
	PYTHONPATH=$MEG_STUB /usr/bin/python3 -c '
import sys, torch
p = sys.argv[1] + "/common.pt"
c = torch.load(p, map_location="cpu")
exec(sys.argv[2])
torch.save(c, p)' "$2" "$3"
}

# megatron_unavailable WHY: the mount at $MNT serves megatron/ as only
# unavailable.txt, which says WHY (a glob)
megatron_unavailable() {
	run ls "$MNT/megatron"
	echo "$output"
	[ "$output" = "unavailable.txt" ]
	run cat "$MNT/megatron/unavailable.txt"
	echo "$output"
	# shellcheck disable=SC2053 # a glob on purpose
	[[ $output == $1 ]]
}
