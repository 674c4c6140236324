# SPDX-License-Identifier: MIT
# Shared setup for the flexfs end-to-end tests (bats-core >= 1.5).
#
# Environment (set by ctest, see bats.cmake): FLEXFS_BIN, FLEXFS_INSPECT,
# FLEXFS_SRC.  Background daemons must not keep bats's fd 3 open, or bats
# waits for them forever: every command that may leave a process behind
# runs with 3>&-.
#
# FLEXFS_EXEC_PREFIX (optional): a command line mount_ff runs the daemon
# under, split on blanks, e.g. "valgrind -q --error-exitcode=99
# --leak-check=full --errors-for-leak-kinds=definite" (tools/test-sanitize.sh).
# Mounting and exiting then get more time, and unmount_ff fails when the
# daemon exits 99 (valgrind found errors).
#
# Reports: every test that calls setup_ff/teardown_ff fails when
#  - ASan/LSan reported anything from any process the test started,
#    daemonized ones included (their stderr is /dev/null, so setup_ff points
#    log_path into the test's directory);
#  - a daemon started by mount_ff printed a sanitizer or valgrind report on
#    stderr (GCC's UBSan runtime ignores log_path and always writes there);
#  - MNT is left a dead mount (its daemon died, e.g. halted by UBSan while
#    daemonized, where its report is lost).
# With FF_STRICT_STDERR=1 any daemon stderr at all fails the test.

bats_require_minimum_version 1.5.0

FLEXFS_SRC=${FLEXFS_SRC:-$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}
FLEXFS_BIN=${FLEXFS_BIN:-$FLEXFS_SRC/build/fs/flexfs}
FLEXFS_INSPECT=${FLEXFS_INSPECT:-$FLEXFS_SRC/build/tools/flexfs-inspect}
FLEXFS_BUILD=$(dirname "$FLEXFS_BIN")
FIXTURE=$FLEXFS_SRC/tests/fixtures/dcp-t113/ckpt
RULES=$FLEXFS_SRC/tests/fixtures/rules.json
# the Debian trixie chroot with torch 2.6 (tools/fixtures/README.md), where
# there is one
CHROOT=${FLEXFS_TORCH2_CHROOT:-/opt/trixie}

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
# background, and wait (up to ~10 s; 60 s under FLEXFS_EXEC_PREFIX) until
# MNT is a mountpoint.  Sets FF_PID and FF_ERR (the daemon's stderr, one
# file per mount, all listed in FF_ERRS for teardown_ff).  Fails with that
# stderr if the daemon died first.
mount_ff() {
	local src=$1 mnt=$2 opts=${3:-} i tries=100
	local -a prefix=()

	read -r -a prefix <<<"${FLEXFS_EXEC_PREFIX:-}"
	((${#prefix[@]} == 0)) || tries=600
	FF_NMOUNT=$((${FF_NMOUNT:-0} + 1))
	FF_ERR=$BATS_TEST_TMPDIR/flexfs.$FF_NMOUNT.stderr
	FF_ERRS+=("$FF_ERR")
	# No huge-page re-exec under a checker: it would run the daemon
	# outside it (see fuse_main.c).
	local thp=${FLEXFS_MALLOC_THP:-}
	((${#prefix[@]} == 0)) || thp=0
	FLEXFS_MALLOC_THP=$thp "${prefix[@]}" "$FLEXFS_BIN" "$src" "$mnt" -f \
		${opts:+-o "$opts"} \
		>"$BATS_TEST_TMPDIR/flexfs.stdout" 2>"$FF_ERR" 3>&- &
	FF_PID=$!
	for ((i = 0; i < tries; i++)); do
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
	echo "flexfs did not mount $mnt within $((tries / 10)) s:" >&2
	cat "$FF_ERR" >&2
	return 1
}

# not_mounted DIR: a function, so that under bats's set -e a mounted DIR
# fails the test wherever this is called (a bare "! cmd" never does).
not_mounted() {
	! mountpoint -q "$1"
}

# wait_gone PID [TENTHS]: wait (up to TENTHS/10 s, default ~10 s; 60 s
# under FLEXFS_EXEC_PREFIX) until PID has exited.  A zombie counts as
# exited here; the caller's wait reaps its own children.
wait_gone() {
	local pid=$1 tenths=${2:-} i state

	[[ -n $tenths ]] || tenths=$([[ -n ${FLEXFS_EXEC_PREFIX:-} ]] &&
		echo 600 || echo 100)
	for ((i = 0; i < tenths; i++)); do
		state=$(ps -o stat= -p "$pid" 2>/dev/null) || return 0
		[[ $state == Z* ]] && return 0
		sleep 0.1
	done
	echo "process $pid still running after $((tenths / 10)) s" >&2
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
	if [[ -n ${FLEXFS_EXEC_PREFIX:-} && $FF_RC -eq 99 ]]; then
		echo "the daemon exited 99 under $FLEXFS_EXEC_PREFIX" \
			"(its report: $FF_ERR, printed by teardown_ff)" >&2
		return 1
	fi
}

# mountinfo_of DIR: DIR's lines in /proc/self/mountinfo.  Unlike
# mountpoint(1) this also sees a dead mount (its daemon gone, every stat()
# failing with ENOTCONN).
mountinfo_of() {
	awk -v m="$1" '$5 == m' /proc/self/mountinfo
}

# daemon_pid MNT: the pid of the daemonized flexfs serving MNT (found by
# its unique command line; only ever used to wait for or kill that pid).
daemon_pid() {
	pgrep -f -- "[ ]$1( |\$)" | head -n 1
}

# mount_refused_line SRC OPTS GLOB...: flexfs SRC MNT -f (with -o OPTS
# unless empty) fails within 60 s (a mount would keep -f in the foreground
# until the timeout), mounts nothing and prints exactly one line, stdout and
# stderr together, that matches every glob GLOB.
mount_refused_line() {
	local src=$1 opts=$2 glob

	shift 2
	run timeout 60 "$FLEXFS_BIN" "$src" "$MNT" -f ${opts:+-o "$opts"} 3>&-
	echo "$output"
	[ "$status" -ne 0 ]
	not_mounted "$MNT"
	[[ -n $output && $output != *$'\n'* ]]
	for glob in "$@"; do
		# shellcheck disable=SC2053 # a glob on purpose
		[[ $output == $glob ]]
	done
}

# Per-test fixture: a fresh mountpoint.
setup_ff() {
	require_bins
	MNT=$BATS_TEST_TMPDIR/mnt
	mkdir -p "$MNT"
	FF_PID=
	FF_DAEMON=
	FF_ERRS=()
	CHROOT_IN=
	# sanitizer reports of every process of this test, daemons included,
	# land in FF_SANLOG.<pid> (see ff_check_reports)
	FF_SANLOG=$BATS_TEST_TMPDIR/sanitizer
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$FF_SANLOG"
	export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}log_path=$FF_SANLOG"
}

# The one line a mount says about the tensors some formats' files leave
# out (docs/usage.md#dtypes-older-readers-cannot-hold): expected, not noise.
FF_DTYPE_NOTE='tensor(s) left out of the files whose readers cannot all hold their dtype'

# ff_quiet [FILE]: the daemon's stderr (FILE, default FF_ERR) says nothing
# but that line.
ff_quiet() {
	! grep -vF "$FF_DTYPE_NOTE" "${1:-$FF_ERR}" | grep -q .
}

# ff_check_reports: fail (printing them) if this test's processes left
# sanitizer reports, or a daemon's stderr has a sanitizer or valgrind
# report (any stderr at all with FF_STRICT_STDERR=1).
ff_check_reports() {
	local f bad=0

	for f in "${FF_SANLOG:-/nonexistent}".*; do
		[[ -e $f ]] || continue
		echo "sanitizer report $f:" >&2
		cat "$f" >&2
		bad=1
	done
	for f in "${FF_ERRS[@]}"; do
		[[ -s $f ]] || continue
		if { [[ -n ${FF_STRICT_STDERR:-} ]] && ! ff_quiet "$f"; } ||
			grep -Eq '^==[0-9]+==|Sanitizer|runtime error:' "$f"; then
			echo "daemon stderr ($f):" >&2
			cat "$f" >&2
			bad=1
		fi
	done
	return "$bad"
}

# Always leave the machine clean: lazy unmount, then stop what is left.
# A mount whose daemon died under it (a crash: a sanitizer that could not
# log, a signal) is cleaned up too, and fails the test.
teardown_ff() {
	local pid dead=0

	if [[ -n ${MNT:-} && -n $(mountinfo_of "$MNT") ]]; then
		if ! timeout 10 stat "$MNT" >/dev/null 2>&1; then
			echo "the daemon serving $MNT is gone: a dead mount" >&2
			dead=1
		fi
		pid=$(daemon_pid "$MNT")
		fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT"
		FF_DAEMON=${FF_DAEMON:-$pid}
	fi
	for pid in ${FF_PID:-} ${FF_DAEMON:-}; do
		kill "$pid" 2>/dev/null || continue
		wait_gone "$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null
	done
	[[ -z ${FF_PID:-} ]] || wait "$FF_PID" 2>/dev/null || true
	[[ -z ${CHROOT_IN:-} ]] || rm -rf "${CHROOT:?}$CHROOT_IN"
	ff_check_reports && ((dead == 0))
}

# check_views_mount FIXTURE TP PP [extra mount opts] [checker args...]:
# mount tests/fixtures/FIXTURE with the rules, run $FF_AFTER_MOUNT PID if a
# test sets one, check every byte of every view against the torch ground
# truth (lib/check_views.py), then require a clean unmount (exit 0) and a
# daemon that said nothing on stderr while serving.
check_views_mount() {
	local fx=$1 tp=$2 pp=$3 extra=${4:-}
	shift 4 || shift $#
	local src=$FLEXFS_SRC/tests/fixtures/$fx

	mount_ff "$src/ckpt" "$MNT" "tp=$tp,pp=$pp,rules=$RULES${extra:+,$extra}"
	[[ -z ${FF_AFTER_MOUNT:-} ]] || "$FF_AFTER_MOUNT" "$FF_PID"
	run /usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/check_views.py" -q \
		--mount "$MNT" --truth "$src/truth" --tp "$tp" --pp "$pp" \
		--rules "$RULES" "$@"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

# chroot_dir RULES: skip the test without the torch 2.6 chroot; else a
# fresh directory in it, CHROOT_IN as the chroot sees it (teardown_ff
# removes it), holding check_views.py, rules.json (a copy of RULES) and
# the empty truth/ and mnt/; MNT is that mnt/.
chroot_dir() {
	[[ -x $CHROOT/usr/bin/python3 ]] ||
		skip "no torch 2.6 chroot at $CHROOT (tools/fixtures/README.md)"
	CHROOT_IN=/tmp/flexfs-bats-$BATS_SUITE_TEST_NUMBER-$$
	rm -rf "${CHROOT:?}$CHROOT_IN"
	mkdir -p "$CHROOT$CHROOT_IN/mnt" "$CHROOT$CHROOT_IN/truth"
	cp "$FLEXFS_SRC/tests/bats/lib/check_views.py" "$CHROOT$CHROOT_IN/"
	cp "$1" "$CHROOT$CHROOT_IN/rules.json"
	MNT=$CHROOT$CHROOT_IN/mnt
}

# chroot_views SRC TP PP OPTS [ARGS...]: mount SRC on MNT (tp=TP,pp=PP and
# OPTS); check_views.py, run by the chroot's torch 2.6 with ARGS, finds
# every view equal to the truth in CHROOT_IN under its rules.json; the
# mount unmounts cleanly.
chroot_views() {
	local src=$1 tp=$2 pp=$3 opts=$4

	shift 4
	mount_ff "$src" "$MNT" "tp=$tp,pp=$pp${opts:+,$opts}"
	run chroot "$CHROOT" python3 "$CHROOT_IN/check_views.py" -q \
		--mount "$CHROOT_IN/mnt" --truth "$CHROOT_IN/truth" \
		--tp "$tp" --pp "$pp" --rules "$CHROOT_IN/rules.json" "$@"
	echo "$src tp=$tp pp=$pp${opts:+ $opts}: $output"
	unmount_ff "$MNT"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
}

# save_dcp DIR <<<SD: torch 1.13 (/usr/bin/python3, through
# tools/fixtures/gen_dcp.py's TorchAPI) saves as a DCP checkpoint in DIR
# the state dict that the Python expression SD on stdin builds (torch in
# scope); skips the test without torch.
save_dcp() {
	/usr/bin/python3 -c 'import torch' 2>/dev/null ||
		skip "torch 1.13 under /usr/bin/python3 writes this checkpoint"
	/usr/bin/python3 -c '
import sys
sys.path.insert(0, sys.argv[2])
from gen_dcp import TorchAPI
api = TorchAPI()
sd = eval(sys.stdin.read(), {"torch": api.torch})
api.dcp.save_state_dict(sd, api.dcp.FileSystemWriter(sys.argv[1]), no_dist=True)
' "$1" "$FLEXFS_SRC/tools/fixtures"
}

# gen_transposed DIR: torch 1.13 writes the checkpoint of tensors saved
# transposed (tools/fixtures/gen_dcp.py --model transposed) into DIR
# (ckpt/ and truth/); prints the generator's log and fails if it fails.
gen_transposed() {
	local out=$1

	if ! /usr/bin/python3 "$FLEXFS_SRC/tools/fixtures/gen_dcp.py" \
		--model transposed --out "$out" >"$out.gen.log" 2>&1; then
		cat "$out.gen.log" >&2
		return 1
	fi
}

# Several mounts checked in one checker process (it imports torch once):
# views_setup in setup(), views_teardown in teardown(); views_add registers
# each mount, views_check checks them all.  VIEWS_MNTS lists the mount
# points in the order they were added.
views_setup() {
	VIEWS_MNTS=()
	VIEWS_PIDS=()
	VIEWS_CHECKS=()
}

views_teardown() {
	local m

	for m in "${VIEWS_MNTS[@]}"; do
		[[ -z $(mountinfo_of "$m") ]] ||
			fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m"
	done
}

# views_add DIR TRUTH OPTS TPxPP...: mount DIR once per TPxPP (tp=,pp=
# and OPTS), each to be checked by views_check against TRUTH.
views_add() {
	local dir=$1 truth=$2 opts=$3 tp pp combo m

	shift 3
	for combo in "$@"; do
		tp=${combo%x*} pp=${combo#*x}
		m=$BATS_TEST_TMPDIR/mnt-${#VIEWS_MNTS[@]}
		mkdir -p "$m"
		mount_ff "$dir" "$m" "tp=$tp,pp=$pp${opts:+,$opts}"
		VIEWS_MNTS+=("$m")
		VIEWS_PIDS+=("$FF_PID")
		VIEWS_CHECKS+=("$m $truth $tp $pp")
	done
}

# views_check: every view of every mount views_add made equals its truth
# (lib/check_views.py), in one checker process; each unmounts cleanly and
# no daemon said anything.
views_check() {
	local i f

	run /usr/bin/python3 - "$FLEXFS_SRC/tests/bats/lib/check_views.py" \
		"${VIEWS_CHECKS[@]}" <<'PY'
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import check_views
rc = 0
for c in sys.argv[2:]:
    m, truth, tp, pp = c.split()
    print("%s tp=%s pp=%s: " % (os.path.basename(truth), tp, pp), end="", flush=True)
    rc |= check_views.main(["-q", "--mount", m, "--truth", truth, "--tp", tp, "--pp", pp])
sys.exit(rc)
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$(grep -c " passed, 0 failed" <<<"$output")" -eq "${#VIEWS_CHECKS[@]}" ]
	for i in "${!VIEWS_MNTS[@]}"; do
		FF_PID=${VIEWS_PIDS[$i]}
		unmount_ff "${VIEWS_MNTS[$i]}"
		[ "$FF_RC" -eq 0 ]
	done
	for f in "${FF_ERRS[@]}"; do
		ff_quiet "$f"
	done
}

# vm_limit KIB: "ulimit -v KIB; " for a command line, or nothing for a
# sanitized build (ASan reserves terabytes of shadow address space at
# start; the plain build's run checks the bound).
vm_limit() {
	if grep -qa __asan_init "$FLEXFS_INSPECT" 2>/dev/null; then
		return 0
	fi
	printf 'ulimit -v %s; ' "$1"
}
