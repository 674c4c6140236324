#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# flexfs-materialize: the views written as files through the core, by one
# process or by MPI ranks.  The oracle is a single-process FUSE mount of
# the same checkpoint with the same options: every file equal byte for
# byte (diff -r), nothing more, nothing less.  Under mpirun each file is
# written by exactly one rank (its -v lines); an interrupted run (a rank
# killed halfway through a file, FLEXFS_MATERIALIZE_KILL_AFTER) completes
# on a rerun, which leaves the files already complete untouched (same
# inode: not rewritten); --verify finds a corrupted byte and names the
# tensor.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
MAT=${FLEXFS_MATERIALIZE:-$(dirname "$FLEXFS_INSPECT")/flexfs-materialize}
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)

setup() {
	setup_ff
	OUT=$BATS_TEST_TMPDIR/out
}

teardown() {
	teardown_ff
}

# One line when MPI is not there, so that the rest still runs.  Under
# ASan (tools/test-sanitize.sh) the ranks run without leak detection:
# OpenMPI's components allocate at MPI_Init and are unloaded at
# MPI_Finalize, so LSan reports their blocks with no module to suppress
# them by; the one-process tests run the same code with leak checks.
require_mpi() {
	"$MAT" --version | grep -q 'MPI: yes' ||
		skip "flexfs-materialize built without MPI (FLEXFS_WITH_MPI)"
	command -v mpirun >/dev/null || skip "mpirun not found"
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
}

# same_as_mount SRC OPTS OUT [NAMES...]: mount SRC with OPTS and compare
# OUT with it: OUT's top-level entries are NAMES (all the mount's when
# none), each equal to the mount's byte for byte, and OUT holds nothing
# else but the run record.
same_as_mount() {
	local src=$1 opts=$2 out=$3 want got
	shift 3

	mount_ff "$src" "$MNT" "$opts"
	if (($# == 0)); then
		want=$(ls "$MNT")
	else
		want=$(printf '%s\n' "$@" | sort)
	fi
	got=$(ls "$out")
	[ "$got" = "$want" ]
	[ -f "$out/.flexfs-materialize" ]
	for e in $want; do
		diff -r "$MNT/$e" "$out/$e"
	done
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

# Each path of OUT's files in the -v lines of output exactly once, written
# by at least two ranks.
one_writer_each() {
	local out=$1 lines=$2

	diff <(cd "$out" && find . -type f ! -name .flexfs-materialize |
		sed 's|^\./||' | sort) \
		<(sed -n 's/^rank [0-9]* wrote \(.*\) ([0-9]* bytes)$/\1/p' \
			<<<"$lines" | sort)
	[ "$(sed -n 's/^rank \([0-9]*\) wrote .*/\1/p' <<<"$lines" |
		sort -u | wc -l)" -ge 2 ]
}

@test "one process: the files equal the mount's at several tp/pp and views" {
	local t113=$FX/dcp-t113/ckpt

	"$MAT" "$t113" "$OUT" -o "tp=2,pp=2,rules=$RULES" --verify
	same_as_mount "$t113" "tp=2,pp=2,rules=$RULES" "$OUT"

	"$MAT" "$t113" "$OUT.2" -o "tp=4,rules=$RULES" --views ranks,hf
	same_as_mount "$t113" "tp=4,rules=$RULES" "$OUT.2" hf ranks

	"$MAT" "$FX/megatron-untied/ckpt/iter_0000100" "$OUT.3" -o tp=1,pp=2,megatron_true_vocab=200 \
		--views megatron,index
	same_as_mount "$FX/megatron-untied/ckpt/iter_0000100" tp=1,pp=2,megatron_true_vocab=200 \
		"$OUT.3" index.json megatron

	"$MAT" "$FX/paddle-flex-p4/ckpt" "$OUT.4" -o tp=2 --views paddle,ranks
	same_as_mount "$FX/paddle-flex-p4/ckpt" tp=2 "$OUT.4" paddle ranks
}

@test "mpirun -np 2 and -np 3: equal to the mount, each file written by one rank" {
	require_mpi
	run "${MPIRUN[@]}" -np 2 "$MAT" "$FX/dcp-t113/ckpt" "$OUT" \
		-o "tp=2,pp=2,rules=$RULES" -v
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"MPI, 2 ranks"* ]]
	one_writer_each "$OUT" "$output"
	same_as_mount "$FX/dcp-t113/ckpt" "tp=2,pp=2,rules=$RULES" "$OUT"

	run "${MPIRUN[@]}" -np 3 "$MAT" "$FX/paddle-flex-p4/ckpt" "$OUT.3" \
		-o tp=2,pp=2 -v --verify
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"MPI, 3 ranks"* ]]
	[[ $output == *"every tensor equal to the tree's"* ]]
	one_writer_each "$OUT.3" "$output"
	same_as_mount "$FX/paddle-flex-p4/ckpt" tp=2,pp=2 "$OUT.3"
}

# interrupted_then_resumed N RUN...: RUN killed after N files of a rank,
# then RUN again without the hook: it completes, skips exactly the files
# complete before (not rewritten: same inode) and leaves no temporary file.
interrupted_then_resumed() {
	local n=$1 before after done_files
	shift

	run env FLEXFS_MATERIALIZE_KILL_AFTER="$n" "$@"
	[ "$status" -ne 0 ]
	# a file cut short lies under its temporary name only
	[ -n "$(find "$OUT" -name '.flexfs-part.*')" ]
	before=$(cd "$OUT" && find . -type f ! -name '.flexfs-*' \
		-printf '%i %p\n' | sort)
	done_files=$(wc -l <<<"$before")
	[ "$done_files" -ge "$n" ]
	run "$@"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" $done_files skipped as complete"* ]]
	after=$(cd "$OUT" && find . -type f ! -name '.flexfs-*' \
		-printf '%i %p\n' | sort)
	# every file complete before is the same file now
	[ -z "$(comm -23 <(echo "$before") <(echo "$after"))" ]
	[ -z "$(find "$OUT" -name '.flexfs-part.*')" ]
	same_as_mount "$FX/dcp-t113/ckpt" "tp=2,pp=2,rules=$RULES" "$OUT"
}

@test "an interrupted run, run again, completes and skips what was done" {
	interrupted_then_resumed 5 "$MAT" "$FX/dcp-t113/ckpt" "$OUT" \
		-o "tp=2,pp=2,rules=$RULES"
}

@test "mpirun: a rank killed mid-file, rerun with another rank count, completes" {
	require_mpi
	run env FLEXFS_MATERIALIZE_KILL_AFTER=4 "${MPIRUN[@]}" -np 2 "$MAT" \
		"$FX/dcp-t113/ckpt" "$OUT" -o "tp=2,pp=2,rules=$RULES"
	[ "$status" -ne 0 ]
	[ -n "$(find "$OUT" -name '.flexfs-part.*')" ]
	interrupted_then_resumed 1 "${MPIRUN[@]}" -np 3 "$MAT" \
		"$FX/dcp-t113/ckpt" "$OUT" -o "tp=2,pp=2,rules=$RULES"
}

@test "--verify catches a corrupted tensor byte and a corrupted header byte" {
	local f=$OUT/ranks/tp00_pp00/model.safetensors

	"$MAT" "$FX/dcp-t113/ckpt" "$OUT" -o "tp=2,pp=2,rules=$RULES"
	run "$MAT" "$FX/dcp-t113/ckpt" "$OUT" -o "tp=2,pp=2,rules=$RULES" \
		--verify
	[ "$status" -eq 0 ]
	# flip the last byte (the last tensor's data) and one of index.json
	# (generated), sizes unchanged: the rerun skips them as complete
	/usr/bin/python3 - "$f" "$OUT/index.json" <<-'EOF'
		import sys
		for path, at in ((sys.argv[1], -1), (sys.argv[2], 40)):
		    b = bytearray(open(path, "rb").read())
		    b[at] ^= 0x01
		    open(path, "wb").write(b)
	EOF
	run "$MAT" "$FX/dcp-t113/ckpt" "$OUT" -o "tp=2,pp=2,rules=$RULES" \
		--verify
	echo "$output"
	[ "$status" -eq 1 ]
	[[ $output == *"skipped as complete"* ]]
	[[ $output == *"$f: tensor "*"expected"* ]]
	[[ $output == *"$OUT/index.json: generated bytes"*"expected"* ]]
	[[ $output == *"verify failed"* ]]
	[ "$(grep -c 'differs: sha256' <<<"$output")" -eq 2 ]
}

@test "errors: one line each, the checkpoint never written" {
	local src=$FX/dcp-t113/ckpt opts="tp=2,pp=2,rules=$RULES"
	local listing

	listing=$(ls -la --time-style=full-iso "$src")
	run "$MAT" "$src" "$src/out" -o "$opts"
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ $output == *"is inside the checkpoint directory"* ]]
	[ ! -e "$src/out" ]
	[ "$(ls -la --time-style=full-iso "$src")" = "$listing" ]

	mkdir -p "$OUT" && touch "$OUT/mine"
	run "$MAT" "$src" "$OUT" -o "$opts"
	[ "$status" -eq 1 ]
	[[ $output == *"$OUT: not empty and no .flexfs-materialize record"* ]]

	"$MAT" "$src" "$OUT.2" -o "$opts"
	run flock "$OUT.2" "$MAT" "$src" "$OUT.2" -o "$opts"
	[ "$status" -eq 1 ]
	[[ $output == *"$OUT.2: in use by another flexfs-materialize run"* ]]
	run "$MAT" "$src" "$OUT.2" -o "tp=4,rules=$RULES"
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ $output == *"holds the output of another run"* ]]

	run "$MAT" "$src" "$OUT.3" -o "$opts" --views ranks,nope
	[ "$status" -eq 1 ]
	[[ $output == *"--views: no 'nope' in this tree (it has: hf, index.json, objects, ranks)"* ]]
	[ ! -e "$OUT.3" ]

	run "$MAT" "$src" "$OUT/mine/x" -o "$opts"
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ $output == *"$OUT/mine/x: cannot create: Not a directory"* ]]
}

@test "mpirun: a rank that cannot write stops every rank, one line, no hang" {
	require_mpi
	local opts="tp=2,pp=2,rules=$RULES"

	"$MAT" "$FX/dcp-t113/ckpt" "$OUT" -o "$opts"
	rm "$OUT/ranks/tp01_pp01/model.safetensors"
	mkdir "$OUT/ranks/tp01_pp01/model.safetensors"
	run timeout 60 "${MPIRUN[@]}" -np 2 "$MAT" "$FX/dcp-t113/ckpt" "$OUT" \
		-o "$opts"
	echo "$output"
	[ "$status" -ne 0 ] && [ "$status" -ne 124 ]
	[ "$(grep -c '^flexfs-materialize: .*: cannot write' <<<"$output")" -eq 1 ]
	[[ $output == *"$OUT/ranks/tp01_pp01/model.safetensors: cannot write: exists and is not a regular file"* ]]
}
