#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Concurrency: several reader processes hammer every file of every view of
# a tp=3,pp=2 mount with random-offset pread()s (buffered and O_DIRECT)
# and mmap() reads, each compared byte for byte with a reference copy that
# this same test verified against the torch ground truth (check_views.py);
# then unmounting (plain and lazy) and SIGTERM while reads are in flight.
#
# FLEXFS_STRESS_SECONDS: how long the readers run per fixture (default 10;
# raise it for longer local runs).  FLEXFS_STRESS_READERS: how many
# (default 6).

load helpers

CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py
STRESS=$FLEXFS_SRC/tests/bats/lib/stress.py
PY=/usr/bin/python3
SECONDS_PER_FIXTURE=${FLEXFS_STRESS_SECONDS:-10}
NREADERS=${FLEXFS_STRESS_READERS:-6}

# kill_readers_reap PID: kill the readers mid-read, then wait (up to 8 s)
# for the daemon PID, the last reference gone, to exit; FF_RC gets its
# status.
kill_readers_reap() {
	local pid=$1 p

	for p in "${READERS[@]}"; do kill -9 "$p"; done
	for p in "${READERS[@]}"; do { wait "$p"; } 2>/dev/null || true; done
	READERS=()
	wait_gone "$pid" 80
	FF_RC=0
	wait "$pid" || FF_RC=$?
	FF_PID=
}

setup() {
	setup_ff
	require_fuse
	FF_STRICT_STDERR=1
	READERS=()
}

teardown() {
	local pid
	for pid in "${READERS[@]}"; do
		kill -9 "$pid" 2>/dev/null || true
	done
	for pid in "${READERS[@]}"; do
		{ wait "$pid"; } 2>/dev/null || true
	done
	teardown_ff
	if [[ -n ${REAPER:-} ]]; then
		kill "$REAPER" 2>/dev/null || true
		wait "$REAPER" 2>/dev/null || true
	fi
}

# reference FIXTURE: mount it at tp=3,pp=2 on a mountpoint of its own,
# copy every file with one sequential read into $REF, unmount, and check
# the copy against the truth: every byte the readers compare with is then
# tied to the bytes torch wrote.
reference() {
	local src=$FLEXFS_SRC/tests/fixtures/$1 refmnt=$BATS_TEST_TMPDIR/refmnt
	REF=$BATS_TEST_TMPDIR/ref-$1
	mkdir -p "$refmnt"
	mount_ff "$src/ckpt" "$refmnt" "tp=3,pp=2,rules=$RULES"
	"$PY" "$STRESS" snapshot "$refmnt" "$REF"
	unmount_ff "$refmnt"
	[ "$FF_RC" -eq 0 ]
	run "$PY" "$CHECK" -q --mount "$REF" --truth "$src/truth" --tp 3 \
		--pp 2 --rules "$RULES"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
}

# start_readers SECONDS [reader args...]: NREADERS background readers of
# $MNT against $REF; pids in READERS, output in $BATS_TEST_TMPDIR/reader.K.
start_readers() {
	local secs=$1 k
	shift
	for ((k = 0; k < NREADERS; k++)); do
		"$PY" "$STRESS" read "$MNT" "$REF" --seconds "$secs" --reader "$k" \
			--progress "$BATS_TEST_TMPDIR/progress.$k" "$@" \
			>"$BATS_TEST_TMPDIR/reader.$k" 2>&1 3>&- &
		READERS+=($!)
	done
}

# wait_readers: wait for every reader; fail unless each exited 0
# (status 3 is wrong bytes).  Prints their reports.
wait_readers() {
	local k rc bad=0
	for ((k = 0; k < ${#READERS[@]}; k++)); do
		rc=0
		wait "${READERS[k]}" || rc=$?
		echo "reader $k exit $rc: $(cat "$BATS_TEST_TMPDIR/reader.$k")"
		[[ $rc -eq 0 ]] || bad=1
		# every file was read in at least one full pass
		grep -Eq ' [1-9][0-9]* full passes' "$BATS_TEST_TMPDIR/reader.$k" ||
			bad=1
	done
	READERS=()
	return "$bad"
}

# wait_ready: every --hold reader has opened and read all its files.
wait_ready() {
	local k i
	for ((k = 0; k < NREADERS; k++)); do
		for ((i = 0; i < 600; i++)); do
			[[ -e $BATS_TEST_TMPDIR/progress.$k.ready ]] && break
			kill -0 "${READERS[k]}" 2>/dev/null || {
				cat "$BATS_TEST_TMPDIR/reader.$k" >&2
				return 1
			}
			sleep 0.1
		done
		[[ -e $BATS_TEST_TMPDIR/progress.$k.ready ]]
	done
}

# ops_total: the readers' operation counts so far, summed.
ops_total() {
	local k n total=0
	for ((k = 0; k < NREADERS; k++)); do
		n=$(cat "$BATS_TEST_TMPDIR/progress.$k" 2>/dev/null || echo 0)
		total=$((total + n))
	done
	echo "$total"
}

# io_chars PID: bytes the process has read (rchar of /proc/PID/io).
io_chars() {
	awk '$1 == "rchar:" { print $2 }' "/proc/$1/io"
}

# stderr_after_teardown_race: the daemon's stderr after the last user of
# a lazily unmounted tree went away is empty, or only libfuse 3.14's perror
# for the kernel's ECONNABORTED teardown race (a worker dequeuing a request
# as the connection ends; see loop_failed() in fs/fuse_main.c, the exit
# status is 0 either way).  That line is dropped for teardown's check.
stderr_after_teardown_race() {
	local other
	other=$(grep -vx 'fuse: reading device: Software caused connection abort' \
		"$FF_ERR" | grep -vF "$FF_DTYPE_NOTE" || true)
	echo "daemon stderr: $(cat "$FF_ERR")"
	[ -z "$other" ]
	: >"$FF_ERR"
}

stress_fixture() {
	local fx=$1 before after threads i n
	reference "$fx"
	mount_ff "$FLEXFS_SRC/tests/fixtures/$fx/ckpt" "$MNT" "tp=3,pp=2,rules=$RULES"
	before=$(io_chars "$FF_PID")
	start_readers "$SECONDS_PER_FIXTURE"
	# the most threads the daemon ran while the readers worked
	threads=0
	for ((i = 0; i < 6; i++)); do
		sleep 0.5
		n=$(find "/proc/$FF_PID/task" -mindepth 1 -maxdepth 1 | wc -l)
		((n > threads)) && threads=$n
	done
	wait_readers
	after=$(io_chars "$FF_PID")
	echo "daemon: $threads threads under load, read $((after - before)) bytes"
	# the readers' requests really reached the daemon, concurrently
	[ "$((after - before))" -gt 100000 ]
	[ "$threads" -gt 2 ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

@test "stress dcp-t26 tp=3 pp=2: concurrent pread/O_DIRECT/mmap readers see the verified bytes" {
	stress_fixture dcp-t26
}

@test "stress dcp-t113 tp=3 pp=2: concurrent pread/O_DIRECT/mmap readers see the verified bytes" {
	stress_fixture dcp-t113
}

@test "unmount with files open: -u is EBUSY, -z detaches, the daemon exits 0 when the readers die" {
	local src=$FLEXFS_SRC/tests/fixtures/dcp-t26 n0 n1 pid
	reference dcp-t26
	mount_ff "$src/ckpt" "$MNT" "tp=3,pp=2,rules=$RULES"
	pid=$FF_PID
	# readers that hold every file open and keep reading them
	start_readers 60 --hold
	wait_ready
	# a plain unmount refuses: the mount is busy, nothing changes
	run fusermount3 -u "$MNT"
	echo "fusermount3 -u: $status: $output"
	[ "$status" -ne 0 ]
	[[ $output == *"Device or resource busy"* ]]
	mountpoint -q "$MNT"
	kill -0 "$pid"
	# a lazy unmount detaches the name at once ...
	fusermount3 -u -z "$MNT"
	not_mounted "$MNT"
	[ -z "$(mountinfo_of "$MNT")" ]
	# ... while the open files keep being served, correctly
	n0=$(ops_total)
	sleep 1.5
	n1=$(ops_total)
	echo "ops after the lazy unmount: $n0 -> $n1"
	[ "$n1" -gt "$n0" ]
	kill -0 "$pid"
	# no reader stopped (a wrong byte or an error would have ended it)
	cat "$BATS_TEST_TMPDIR"/reader.*
	for p in "${READERS[@]}"; do kill -0 "$p"; done
	# the readers die (mid-read); the last reference goes; the daemon
	# sees the connection end and exits 0 within a few seconds
	kill_readers_reap "$pid"
	echo "daemon exit $FF_RC"
	[ "$FF_RC" -eq 0 ]
	[ ! -e "/proc/$pid" ] # reaped: no zombie
	[ -z "$(pgrep -f -- "[ ]$MNT( |\$)")" ]
	# the mountpoint is an ordinary empty directory again
	not_mounted "$MNT"
	[ -z "$(ls -A "$MNT")" ]
	rmdir "$MNT"
	stderr_after_teardown_race
}

@test "readers killed while the mount is lazily detached under load: no hang" {
	# no pause between the lazy unmount and the kill: requests are in
	# flight when the readers die
	local pid
	reference dcp-t113
	mount_ff "$FLEXFS_SRC/tests/fixtures/dcp-t113/ckpt" "$MNT" "tp=3,pp=2,rules=$RULES"
	pid=$FF_PID
	start_readers 60 --hold
	wait_ready
	fusermount3 -u -z "$MNT"
	kill_readers_reap "$pid"
	[ "$FF_RC" -eq 0 ]
	[ ! -e "/proc/$pid" ]
	not_mounted "$MNT"
	stderr_after_teardown_race
}

@test "SIGTERM to a daemonized flexfs under load: exit 0, unmounted, never wrong bytes" {
	local src=$FLEXFS_SRC/tests/fixtures/dcp-t26 rstat=$BATS_TEST_TMPDIR/reap k rc
	reference dcp-t26
	# a subreaper collects the exit status of the daemon that
	# fuse_daemonize() forks (not -f: the real daemon path)
	"$PY" "$STRESS" reap "$rstat" -- "$FLEXFS_BIN" "$src/ckpt" "$MNT" \
		-o "tp=3,pp=2,rules=$RULES" >"$BATS_TEST_TMPDIR/reap.out" 2>&1 3>&- &
	REAPER=$!
	for ((k = 0; k < 100; k++)); do
		grep -q '^daemon ' "$rstat" 2>/dev/null && break
		sleep 0.1
	done
	cat "$rstat" "$BATS_TEST_TMPDIR/reap.out"
	grep -qx 'launcher 0' "$rstat"
	FF_DAEMON=$(awk '$1 == "daemon" { print $2 }' "$rstat")
	[[ $FF_DAEMON =~ ^[0-9]+$ ]]
	mountpoint -q "$MNT"
	# that pid is the flexfs serving MNT, now a child of the reaper
	tr '\0' ' ' <"/proc/$FF_DAEMON/cmdline" | grep -q -- " $MNT "
	[[ $(ps -o ppid= -p "$FF_DAEMON" | tr -d ' ') == "$REAPER" ]]
	# readers: any wrong byte fails; errors once the daemon is gone end
	# them quietly (an mmap read can also die of SIGBUS then)
	start_readers 60 --tolerate
	sleep 2
	[ "$(ops_total)" -gt 0 ]
	kill -TERM "$FF_DAEMON"
	wait_gone "$FF_DAEMON" 80
	for ((k = 0; k < 50; k++)); do
		grep -Eq '^(exit|signal) ' "$rstat" && break
		sleep 0.1
	done
	cat "$rstat"
	grep -qx 'exit 0' "$rstat"
	FF_DAEMON=
	wait "$REAPER"
	REAPER=
	not_mounted "$MNT"
	[ -z "$(mountinfo_of "$MNT")" ]
	for ((k = 0; k < ${#READERS[@]}; k++)); do
		kill -9 "${READERS[k]}" 2>/dev/null || true
		rc=0
		{ wait "${READERS[k]}"; } 2>/dev/null || rc=$?
		echo "reader $k exit $rc: $(cat "$BATS_TEST_TMPDIR/reader.$k")"
		# 0: stopped by an error or killed here (137); SIGBUS (135)
		# from an mmap read after the daemon went; never 3 (wrong bytes)
		[[ $rc -eq 0 || $rc -eq 137 || $rc -eq 135 ]]
	done
	READERS=()
}
