# SPDX-License-Identifier: MIT
# Shared setup for the flexfs end-to-end tests (bats-core >= 1.5).
#
# Environment (set by ctest, see bats.cmake): FLEXFS_BIN, FLEXFS_INSPECT,
# FLEXFS_SRC.  Background daemons must not keep bats's fd 3 open, or bats
# waits for them forever: every command that may leave a process behind
# runs with 3>&-.

bats_require_minimum_version 1.5.0

FLEXFS_SRC=${FLEXFS_SRC:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}
FLEXFS_BIN=${FLEXFS_BIN:-$FLEXFS_SRC/build/fs/flexfs}
FLEXFS_INSPECT=${FLEXFS_INSPECT:-$FLEXFS_SRC/build/tools/flexfs-inspect}
FLEXFS_BUILD=$(dirname "$FLEXFS_BIN")
FIXTURE=$FLEXFS_SRC/tests/fixtures/dcp-t113/ckpt
RULES=$FLEXFS_SRC/tests/fixtures/rules.json

# Tests that mount call this first: skip (not fail) only where FUSE itself
# is unavailable to this user.  Startup-error tests never mount and run
# everywhere.
require_fuse() {
	[[ -c /dev/fuse ]] ||
		skip "no /dev/fuse: FUSE mount tests need the fuse module"
	[[ -r /dev/fuse && -w /dev/fuse ]] ||
		skip "/dev/fuse is not read-writable by $(id -un)"
	command -v fusermount3 >/dev/null ||
		skip "fusermount3 not found: FUSE mount tests need fuse3"
}

# Everything else missing is a failure: the build or the fixtures are
# broken, not the machine.
require_bins() {
	if [[ ! -x $FLEXFS_BIN || ! -d $FIXTURE || ! -f $RULES ]]; then
		echo "missing $FLEXFS_BIN, $FIXTURE or $RULES" >&2
		return 1
	fi
}

# mount_ff SRC MNT [OPTS]: run flexfs in the foreground, in the
# background, and wait (up to ~10 s) until MNT is a mountpoint.  Sets
# FF_PID and FF_ERR (the daemon's stderr).  Fails with that stderr if the
# daemon died first.
mount_ff() {
	local src=$1 mnt=$2 opts=${3:-} i

	FF_ERR=$BATS_TEST_TMPDIR/flexfs.stderr
	"$FLEXFS_BIN" "$src" "$mnt" -f ${opts:+-o "$opts"} \
		>"$BATS_TEST_TMPDIR/flexfs.stdout" 2>"$FF_ERR" 3>&- &
	FF_PID=$!
	for ((i = 0; i < 100; i++)); do
		mountpoint -q "$mnt" && return 0
		if ! kill -0 "$FF_PID" 2>/dev/null; then
			wait "$FF_PID"
			echo "flexfs exited ($?) before mounting:" >&2
			cat "$FF_ERR" >&2
			FF_PID=
			return 1
		fi
		sleep 0.1
	done
	echo "flexfs did not mount $mnt within 10 s:" >&2
	cat "$FF_ERR" >&2
	return 1
}

# not_mounted DIR: a function, so that under bats's set -e a mounted DIR
# fails the test wherever this is called (a bare "! cmd" never does).
not_mounted() {
	! mountpoint -q "$1"
}

# wait_gone PID: wait (up to ~10 s) until PID has exited.  A zombie
# counts as exited here; the caller's wait reaps its own children.
wait_gone() {
	local pid=$1 i state

	for ((i = 0; i < 100; i++)); do
		state=$(ps -o stat= -p "$pid" 2>/dev/null) || return 0
		[[ $state == Z* ]] && return 0
		sleep 0.1
	done
	echo "process $pid still running after 10 s" >&2
	return 1
}

# unmount_ff MNT: unmount with fusermount3 and wait for the foreground
# daemon started by mount_ff; FF_RC gets its exit status.
unmount_ff() {
	local mnt=$1 pid=${FF_PID:-}

	fusermount3 -u "$mnt" || return 1
	[[ -n $pid ]] || return 0
	wait_gone "$pid" || return 1
	FF_RC=0
	wait "$pid" || FF_RC=$?
	FF_PID=
}

# daemon_pid MNT: the pid of the daemonized flexfs serving MNT (found by
# its unique command line; only ever used to wait for or kill that pid).
daemon_pid() {
	pgrep -f -- "[ ]$1( |\$)" | head -n 1
}

# Per-test fixture: a fresh mountpoint.
setup_ff() {
	require_bins
	MNT=$BATS_TEST_TMPDIR/mnt
	mkdir -p "$MNT"
	FF_PID=
	FF_DAEMON=
}

# Always leave the machine clean: lazy unmount, then stop what is left.
teardown_ff() {
	local pid

	if [[ -n ${MNT:-} ]] && mountpoint -q "$MNT" 2>/dev/null; then
		pid=$(daemon_pid "$MNT")
		fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT"
		FF_DAEMON=${FF_DAEMON:-$pid}
	fi
	for pid in ${FF_PID:-} ${FF_DAEMON:-}; do
		kill "$pid" 2>/dev/null || continue
		wait_gone "$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null
	done
	[[ -z ${FF_PID:-} ]] || wait "$FF_PID" 2>/dev/null || true
}
