#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# A focused end-to-end run meant for a memory checker: tools/test-sanitize.sh
# runs this file with
#   FLEXFS_EXEC_PREFIX="valgrind -q --error-exitcode=99 --leak-check=full
#                       --errors-for-leak-kinds=definite --log-file=DIR/vg.%p"
# (valgrind's own messages in a log per process, which the script checks)
# so that the daemon (and the startup error paths, and flexfs-inspect) run
# under memcheck: every byte of two mounts is read and checked, readers run
# concurrently, the daemon is stopped by unmount and by SIGTERM, and any
# memcheck error or definite leak makes the process exit 99, which fails
# the test (unmount_ff checks it; so do the tests here).  Without the
# prefix it is an ordinary, quick end-to-end test.

load helpers

CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py
STRESS=$FLEXFS_SRC/tests/bats/lib/stress.py
PY=/usr/bin/python3

setup() {
	setup_ff
	FF_STRICT_STDERR=1
	read -r -a PREFIX <<<"${FLEXFS_EXEC_PREFIX:-}"
	READERS=()
	# The daemon re-executes itself for huge-page malloc (fuse_main.c);
	# under a checker the re-exec would leave the checker behind.
	((${#PREFIX[@]} == 0)) || export FLEXFS_MALLOC_THP=0
}

teardown() {
	local pid
	for pid in "${READERS[@]}"; do
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	teardown_ff
}

# under_prefix PID: with FLEXFS_EXEC_PREFIX, PID really runs under it (the
# running image is the tool's, e.g. /usr/libexec/valgrind/memcheck-*).
under_prefix() {
	((${#PREFIX[@]})) || return 0
	echo "daemon image: $(readlink "/proc/$1/exe")"
	[[ $(readlink "/proc/$1/exe") == *"${PREFIX[0]##*/}"* ]]
}

# checked FIXTURE TP PP [extra opts] [checker args...]: every view byte
# against the truth with the daemon under the prefix, then a clean unmount.
checked() {
	FF_AFTER_MOUNT=under_prefix check_views_mount "$@"
}

@test "memcheck: dcp-t26 tp=3 pp=2, every byte, clean unmount" {
	require_fuse
	checked dcp-t26 3 2
}

@test "memcheck: dcp-t113 tp=2 pp=2, pp_renumber, sharded hf/, every byte" {
	require_fuse
	checked dcp-t113 2 2 pp_renumber,hf_shard_size=1K --pp-renumber
}

@test "memcheck: concurrent readers, then SIGTERM: exit 0, no errors" {
	require_fuse
	local src=$FLEXFS_SRC/tests/fixtures/dcp-t26 ref=$BATS_TEST_TMPDIR/ref k rc pid
	mount_ff "$src/ckpt" "$MNT" "tp=3,pp=2,rules=$RULES"
	pid=$FF_PID
	under_prefix "$pid"
	"$PY" "$STRESS" snapshot "$MNT" "$ref"
	run "$PY" "$CHECK" -q --mount "$ref" --truth "$src/truth" --tp 3 --pp 2 \
		--rules "$RULES"
	echo "$output"
	[ "$status" -eq 0 ]
	for ((k = 0; k < 4; k++)); do
		"$PY" "$STRESS" read "$MNT" "$ref" --seconds 4 --reader "$k" \
			>"$BATS_TEST_TMPDIR/reader.$k" 2>&1 3>&- &
		READERS+=($!)
	done
	for ((k = 0; k < 4; k++)); do
		rc=0
		wait "${READERS[k]}" || rc=$?
		echo "reader $k exit $rc: $(cat "$BATS_TEST_TMPDIR/reader.$k")"
		[ "$rc" -eq 0 ]
	done
	READERS=()
	kill -TERM "$pid"
	wait_gone "$pid"
	FF_RC=0
	wait "$pid" || FF_RC=$?
	FF_PID=
	echo "daemon exit $FF_RC"
	[ "$FF_RC" -eq 0 ]
	not_mounted "$MNT"
	ff_quiet
}

@test "memcheck: startup errors exit 1 with one line, no leak" {
	local bad=$BATS_TEST_TMPDIR/bad.json
	echo '[{"match": "block.weight", "split": 1,]' >"$bad"
	run --separate-stderr "${PREFIX[@]}" "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o "tp=2,rules=$bad" 3>&-
	echo "$status: $stderr"
	[ "$status" -eq 1 ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	run --separate-stderr "${PREFIX[@]}" "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o tp=2 3>&-
	echo "$status: $stderr"
	[ "$status" -eq 1 ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ $stderr == *block.weight* ]]
	run --separate-stderr "${PREFIX[@]}" "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o "tp=0,rules=$RULES" 3>&-
	echo "$status: $stderr"
	[ "$status" -eq 1 ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	run --separate-stderr "${PREFIX[@]}" "$FLEXFS_BIN" "$FIXTURE" \
		"$BATS_TEST_TMPDIR/no-mnt" -o "tp=2,rules=$RULES" 3>&-
	echo "$status: $stderr"
	[ "$status" -eq 1 ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	not_mounted "$MNT"
}

@test "memcheck: flexfs-inspect plans and prints JSON without errors" {
	run --separate-stderr "${PREFIX[@]}" "$FLEXFS_INSPECT" "$FIXTURE" --json \
		-o "tp=3,pp=2,rules=$RULES"
	echo "$status: $stderr"
	[ "$status" -eq 0 ]
	[ -z "$stderr" ]
	[ "${lines[0]}" = "{" ]
}
