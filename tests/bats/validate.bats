#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# One validation path (#17 item 6): the mount and flexfs-inspect build the
# same stack (fs/stack.h: source, transform, plan, tree), so they accept
# and refuse exactly the same inputs with the same line.  The whole case
# corpus (tests/cases, assembled by test_cases --keep) and inputs refused
# only by the tree go through both.

load helpers

PY3=/usr/bin/python3

setup() {
	setup_ff
	require_fuse
	TEST_CASES=$(dirname "$FLEXFS_BIN")/../tests/test_cases
	[[ -x $TEST_CASES ]] || {
		echo "missing $TEST_CASES" >&2
		return 1
	}
}

teardown() {
	mountpoint -q "$MNT" && fusermount3 -u -z "$MNT"
	teardown_ff
}

# both DIR OPTS: run flexfs-inspect and the mount (foreground; unmounted
# again once up) on DIR; prints "rc messages" for each, prefixes dropped,
# on two lines (several lines of one program joined by '|').
both() {
	local dir=$1 opts=$2 irc=0 mrc i pid
	local ierr=$BATS_TEST_TMPDIR/inspect.err merr=$BATS_TEST_TMPDIR/mount.err

	"$FLEXFS_INSPECT" "$dir" -o "$opts" >/dev/null 2>"$ierr" || irc=$?
	"$FLEXFS_BIN" "$dir" "$MNT" -f -o "$opts" >/dev/null 2>"$merr" 3>&- &
	pid=$!
	for ((i = 0; i < 200; i++)); do
		mountpoint -q "$MNT" && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	mountpoint -q "$MNT" && fusermount3 -u "$MNT"
	mrc=0
	wait "$pid" || mrc=$?
	echo "$irc $(sed 's/^flexfs-inspect: //' "$ierr" | paste -sd '|')"
	echo "$mrc $(sed 's/^flexfs: //' "$merr" | paste -sd '|')"
}

@test "the whole case corpus: the mount and flexfs-inspect accept and refuse the same inputs, with the same line" {
	local keep=$BATS_TEST_TMPDIR/cases d n=0 refused=0 out
	mkdir "$keep"
	(cd "$FLEXFS_SRC/tests" && "$TEST_CASES" --keep "$keep" >/dev/null)
	for d in "$keep"/flx-cases.*/{invalid,valid}.*; do
		[[ -d $d ]] || continue
		out=$(both "$d" "tp=$(cat "$d.tp"),rules=$RULES")
		if [[ $(sed -n 1p <<<"$out") != "$(sed -n 2p <<<"$out")" ]]; then
			echo "differ on ${d##*/}:"
			echo "$out"
			return 1
		fi
		[[ $out == 0* ]] || refused=$((refused + 1))
		n=$((n + 1))
	done
	echo "$n cases, $refused refused by both"
	[ "$n" -ge 140 ] && [ "$refused" -ge 130 ] && [ "$refused" -lt "$n" ]
}

@test "what only the tree refuses (an extra named like a generated file) is refused by flexfs-inspect too, table and --json" {
	local ck=$BATS_TEST_TMPDIR/ckpt out
	cp -a "$FIXTURE" "$ck"
	echo x >"$ck/model.safetensors" # hf/model.safetensors is generated
	run both "$ck" "tp=2,rules=$RULES"
	echo "$output"
	[ "${lines[0]}" = "${lines[1]}" ]
	[[ ${lines[0]} == "1 model.safetensors: two entries of one directory share this name" ]]
	run "$FLEXFS_INSPECT" "$ck" --json -o "tp=2,rules=$RULES"
	[ "$status" -eq 1 ]
	[[ $output == *"model.safetensors: two entries of one directory share this name"* ]]
}

@test "control and bidi characters are escaped (%XX) in served names (test_formats: in error lines); a safe extra name is kept" {
	local ck=$BATS_TEST_TMPDIR/ckpt
	cp -a "$FIXTURE" "$ck"
	# U+202E RIGHT-TO-LEFT OVERRIDE, U+009B CSI, ESC; and a plain one
	printf 'x' >"$ck/$(printf 'evil\xe2\x80\xaenosj.json')"
	printf 'y' >"$ck/$(printf 'csi\xc2\x9b\x1b[2J%%.txt')"
	printf 'z' >"$ck/notes-ü.txt"
	mount_ff "$ck" "$MNT" "tp=2,rules=$RULES"
	[ "$(cat "$MNT/hf/evil%E2%80%AEnosj.json")" = x ]
	[ "$(cat "$MNT/hf/csi%C2%9B%1B[2J%25.txt")" = y ]
	[ "$(cat "$MNT/hf/notes-ü.txt")" = z ]
	# no served name holds a raw control or bidi character
	run env LC_ALL=C.UTF-8 "$PY3" -c '
import os, sys, unicodedata
bad = [n for d, ds, fs in os.walk(sys.argv[1]) for n in ds + fs
       if any(unicodedata.category(c) == "Cc" or
              c in "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
              for c in n)]
print(bad)
sys.exit(1 if bad else 0)' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
}

@test "a tensor whose file name would pass 255 bytes is refused by both, with the same line" {
	local ck=$BATS_TEST_TMPDIR/long
	save_dcp "$ck" <<'PY'
{"w" * 252: torch.zeros(4), "short.weight": torch.ones(4)}
PY
	run both "$ck" "tp=1"
	echo "$output"
	[ "${lines[0]}" = "${lines[1]}" ]
	# the line names the checkpoint file the tensor is read from
	[[ ${lines[0]} == "1 "*"__0_0.distcp: www"*"www: tensor name too long for a file name (the tensor is read from this file)" ]]
}

@test "tensor names with bidi and C1 characters: escaped in the served file names and in flexfs-inspect's table" {
	local ck=$BATS_TEST_TMPDIR/bidi
	save_dcp "$ck" <<'PY'
{"evil\u202eweight": torch.zeros(4), "csi\u009b.x": torch.ones(2)}
PY
	run "$FLEXFS_INSPECT" "$ck" -o tp=1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"evil%E2%80%AEweight"* && $output == *"csi%C2%9B.x"* ]]
	[[ $output != *$'\xe2\x80\xae'* && $output != *$'\xc2\x9b'* ]]
	mount_ff "$ck" "$MNT" "tp=1"
	local d=$MNT/ranks/tp00_pp00/tensors
	[ "$(/usr/bin/python3 -c 'import numpy, sys; print(numpy.load(sys.argv[1]).tolist())' "$d/evil%E2%80%AEweight.npy")" = "[0.0, 0.0, 0.0, 0.0]" ]
	[ "$(/usr/bin/python3 -c 'import numpy, sys; print(numpy.load(sys.argv[1]).tolist())' "$d/csi%C2%9B.x.npy")" = "[1.0, 1.0]" ]
	# index.json keeps the true names (JSON carries them)
	grep -q 'evil\\u202eweight\|evil'$'\xe2\x80\xae''weight' "$MNT/index.json"
}

@test "an item-level error under a tensor name with bidi and C1 characters: both front ends print it escaped, never raw" {
	local keep=$BATS_TEST_TMPDIR/cases d out
	mkdir "$keep"
	(cd "$FLEXFS_SRC/tests" && "$TEST_CASES" --keep "$keep" >/dev/null)
	d=$(echo "$keep"/flx-cases.*/invalid.item_past_eof_bidi_fqn)
	[[ -d $d ]]
	out=$(both "$d" "tp=2,rules=$RULES")
	echo "$out"
	[ "$(sed -n 1p <<<"$out")" = "$(sed -n 2p <<<"$out")" ]
	[[ $out == *"attention.%E2%80%AEqw%C2%9B.weight"*"runs past the end of the file"* ]]
	! LC_ALL=C grep -q $'\xe2\x80\xae\|\xc2\x9b' <<<"$out"
}
