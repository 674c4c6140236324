#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Mounting flexfs: the tree's shape, read-only semantics, clean unmount,
# the mount(8) helper personalities and startup errors (which must all be
# reported synchronously, before daemonizing, as one stderr line).
# Byte-level content of the views is checked elsewhere (check_views.py).

load helpers

# mount(8) only finds helpers in /sbin: link ours there for the -t/-T
# tests, only as root and only if nothing else owns those names.
setup_file() {
	export FF_SBIN_LINKED=
	[[ $(id -u) == 0 && -x ${FLEXFS_BIN:-} ]] || return 0
	# A link to this very binary is ours (left by an interrupted run).
	for name in mount.flexfs mount.fuse.flexfs; do
		[[ $(readlink "/sbin/$name") == "$FLEXFS_BIN" ]] && continue
		[[ -e /sbin/$name || -L /sbin/$name ]] && return 0
	done
	for name in mount.flexfs mount.fuse.flexfs; do
		ln -sfn "$FLEXFS_BIN" "/sbin/$name"
	done
	FF_SBIN_LINKED=1
}

teardown_file() {
	local name

	[[ -n ${FF_SBIN_LINKED:-} ]] || return 0
	for name in mount.flexfs mount.fuse.flexfs; do
		[[ $(readlink "/sbin/$name") == "$FLEXFS_BIN" ]] &&
			rm -f "/sbin/$name"
	done
	return 0
}

require_sbin_helper() {
	[[ -n ${FF_SBIN_LINKED:-} ]] ||
		skip "needs root and no existing /sbin/mount.flexfs"
}

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# The startup error contract: non-zero, nothing mounted, exactly one line
# on stderr, starting with $1 and containing each further argument.
assert_one_line_error() {
	local prefix=$1 word

	shift
	echo "status=$status stderr: $stderr" >&2
	[[ $status -ne 0 ]]
	[[ ${#stderr_lines[@]} -eq 1 ]]
	[[ ${stderr_lines[0]} == "$prefix"* ]]
	for word in "$@"; do
		[[ ${stderr_lines[0]} == *"$word"* ]]
	done
	not_mounted "$MNT"
}

@test "mount shows index.json, ranks, hf and objects at the root" {
	require_fuse
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	run ls -A "$MNT"
	[[ $status -eq 0 ]]
	[[ $output == $'hf\nindex.json\nobjects\nranks' ]]
	run ls "$MNT/ranks"
	[[ $output == $'tp00_pp00\ntp01_pp00' ]]
	[[ $(head -c 1 "$MNT/index.json") == "{" ]]
	grep -q "fuse.flexfs" <(findmnt -n -o FSTYPE "$MNT")
	[[ $(findmnt -n -o SOURCE "$MNT") == "$(realpath "$FIXTURE")" ]]
	findmnt -n -o OPTIONS "$MNT" | grep -Eq '(^|,)ro(,|$)'
	findmnt -n -o OPTIONS "$MNT" | grep -q default_permissions
	! findmnt -n -o OPTIONS "$MNT" | grep -q allow_other
}

@test "tp=2,pp=2 presents four rank directories" {
	require_fuse
	mount_ff "$FIXTURE" "$MNT" "tp=2,pp=2,rules=$RULES"
	run ls "$MNT/ranks"
	[[ $output == $'tp00_pp00\ntp00_pp01\ntp01_pp00\ntp01_pp01' ]]
}

@test "unmount: the daemon exits 0, is reaped, and said nothing" {
	require_fuse
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	local pid=$FF_PID
	cat "$MNT/index.json" >/dev/null
	unmount_ff "$MNT"
	[[ $FF_RC -eq 0 ]]
	[[ ! -e /proc/$pid ]]
	not_mounted "$MNT"
	[[ ! -s $FF_ERR ]]
}

# The mount's bdi readahead sets the size and number of FUSE read requests
# in flight (docs/performance.md).  Writing it needs root.
@test "read_ahead_kb: raised to 4 requests by default, kept at 0, set as given" {
	require_fuse
	[[ $(id -u) == 0 ]] || skip "needs root (sysfs)"
	local ra
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	ls "$MNT" >/dev/null
	ra=$(cat "/sys/class/bdi/$(mountpoint -d "$MNT")/read_ahead_kb")
	echo "default: $ra" >&2
	# 4 x the request size, itself at most 1 MiB and a whole number of
	# pages: 3984 (996 KiB requests) or 4096.
	[[ $ra -ge 2048 && $ra -le 4096 && $((ra % 16)) -eq 0 ]]
	unmount_ff "$MNT"
	# 0: the kernel's own (VM_READAHEAD_PAGES, 128 KiB), left alone.
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES,read_ahead_kb=0"
	ls "$MNT" >/dev/null
	ra=$(cat "/sys/class/bdi/$(mountpoint -d "$MNT")/read_ahead_kb")
	echo "read_ahead_kb=0: $ra" >&2
	[[ $ra -le 512 ]]
	unmount_ff "$MNT"
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES,read_ahead_kb=1536"
	ls "$MNT" >/dev/null
	[[ $(cat "/sys/class/bdi/$(mountpoint -d "$MNT")/read_ahead_kb") == 1536 ]]
	unmount_ff "$MNT"
	[[ ! -s $FF_ERR ]]
}

# What the daemon asks of the kernel at INIT (fs/fuse_ll.c), from
# libfuse's debug output: requests a pipe can splice in 4 pieces (at most
# 1 MiB, whole pages), and 64 background requests so that 8 readers can
# each keep a readahead window in flight.
@test "INIT: request size fits a pipe, max_background 64" {
	require_fuse
	local w
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES,debug"
	ls "$MNT" >/dev/null
	unmount_ff "$MNT"
	grep -E '^ +max_(write|background)=|congestion' "$FF_ERR"
	grep -qx '   max_background=64' "$FF_ERR"
	grep -qx '   congestion_threshold=48' "$FF_ERR"
	w=$(sed -n 's/^   max_write=0x\([0-9a-f]*\)$/\1/p' "$FF_ERR")
	[[ -n $w ]]
	w=$((16#$w))
	((w > 0 && w <= 1048576 && w % 4096 == 0))
}

# Cold mounts (resolver/dcp.c): small .distcp files are read ahead while
# the metadata is decoded; large ones are not (that would read tensors).
# Two files the metadata does not use show it apart from the item reads.
@test "mount reads small .distcp files ahead, not large ones" {
	require_fuse
	command -v fincore >/dev/null || skip "no fincore"
	local ck=$BATS_TEST_TMPDIR/ckpt res
	cp -a "$FIXTURE" "$ck"
	head -c 1048576 /dev/urandom >"$ck/__9_0.distcp"
	head -c 5242880 /dev/urandom >"$ck/__9_1.distcp"
	/usr/bin/python3 - "$ck/__9_0.distcp" "$ck/__9_1.distcp" <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
	res=$(fincore -b -n -o RES "$ck/__9_0.distcp" "$ck/__9_1.distcp" | tr -s ' \n' ' ')
	echo "before: $res"
	[[ $res == " 0 0 " || $res == "0 0 " ]]
	mount_ff "$ck" "$MNT" "tp=2,rules=$RULES"
	ls "$MNT" >/dev/null
	# POSIX_FADV_WILLNEED starts the reads and returns: on a busy machine
	# they may still be in flight when the mount is up
	for _ in $(seq 50); do
		res=$(fincore -b -n -o RES "$ck/__9_0.distcp" "$ck/__9_1.distcp" | tr -s ' \n' ' ')
		read -r -a r <<<"$res"
		((r[0] == 1048576)) && break
		sleep 0.1
	done
	echo "after: $res"
	unmount_ff "$MNT"
	# WILLNEED is advice: the kernel may leave a few pages unread (CI once
	# had 2 of 256 missing after 5 s), so "read ahead" is most of the file;
	# the large file must not have been touched at all
	((r[0] >= 1048576 * 3 / 4 && r[1] == 0))
	[[ ! -s $FF_ERR ]]
}

# Huge pages for malloc (fuse_main.c): with THP in madvise mode the daemon
# re-executes itself once with glibc.malloc.hugetlb=1, and only then.
@test "malloc huge pages: one re-exec with the tunable, none when turned off" {
	require_fuse
	grep -q '\[madvise\]' /sys/kernel/mm/transparent_hugepage/enabled ||
		skip "THP is not in madvise mode here"
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	tr '\0' '\n' <"/proc/$FF_PID/environ" >"$BATS_TEST_TMPDIR/env"
	grep -qx 'GLIBC_TUNABLES=glibc.malloc.hugetlb=1' "$BATS_TEST_TMPDIR/env"
	grep -qx 'FLEXFS_THP_REEXEC=-' "$BATS_TEST_TMPDIR/env"
	[[ $(readlink "/proc/$FF_PID/exe") == "$(readlink -f "$FLEXFS_BIN")" ]]
	[[ $(head -c 1 "$MNT/index.json") == "{" ]]
	unmount_ff "$MNT"
	[[ $FF_RC -eq 0 && ! -s $FF_ERR ]]
	FLEXFS_MALLOC_THP=0 mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	! tr '\0' '\n' <"/proc/$FF_PID/environ" | grep -q FLEXFS_THP_REEXEC
	unmount_ff "$MNT"
	# An existing tunable is kept, and then nothing is added.
	GLIBC_TUNABLES=glibc.malloc.hugetlb=0 mount_ff "$FIXTURE" "$MNT" \
		"tp=2,rules=$RULES"
	! tr '\0' '\n' <"/proc/$FF_PID/environ" | grep -q FLEXFS_THP_REEXEC
	unmount_ff "$MNT"
}

@test "writes fail with EROFS" {
	require_fuse
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	local f=$MNT/index.json cmd
	for cmd in "touch $MNT/new" "echo x > $f" "echo x >> $f" \
		"mkdir $MNT/d" "rm -f $f" "rmdir $MNT/hf" "truncate -s 0 $f" \
		"mv $f $MNT/moved" "ln $f $MNT/hard" "ln -s x $MNT/sym" \
		"chmod 600 $f" "mknod $MNT/fifo p"; do
		run bash -c "$cmd"
		echo "$cmd -> $status: $output" >&2
		[[ $status -ne 0 ]]
		[[ $output == *"Read-only file system"* ]]
	done
	[[ $(head -c 1 "$f") == "{" ]]
}

@test "a missing name is ENOENT (twice: the negative entry is cached)" {
	require_fuse
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	run cat "$MNT/no-such-file"
	[[ $status -ne 0 && $output == *"No such file or directory"* ]]
	run stat "$MNT/ranks/no-such-rank"
	[[ $status -ne 0 && $output == *"No such file or directory"* ]]
	run stat "$MNT/ranks/no-such-rank"
	[[ $status -ne 0 && $output == *"No such file or directory"* ]]
	run ls "$MNT/index.json/child"
	[[ $status -ne 0 && $output == *"Not a directory"* ]]
}

@test "files are 0444, directories 0555, owned by the mounting user" {
	require_fuse
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	[[ $(stat -c %a "$MNT/index.json") == 444 ]]
	[[ $(stat -c %F "$MNT/index.json") == "regular file" ]]
	[[ $(stat -c %a "$MNT") == 555 ]]
	[[ $(stat -c %a "$MNT/ranks/tp00_pp00") == 555 ]]
	[[ $(stat -c %F "$MNT/ranks") == directory ]]
	[[ $(stat -c %u:%g "$MNT/index.json") == "$(id -u):$(id -g)" ]]
	[[ $(stat -c %s "$MNT/index.json") -eq $(wc -c <"$MNT/index.json") ]]
	[[ $(stat -f -c %b "$MNT") -gt 0 ]]
	# -a lists . and .. too.
	run ls -a "$MNT/ranks"
	[[ ${lines[0]} == . && ${lines[1]} == .. ]]
}

@test "files can be mmap()ed (no direct_io)" {
	require_fuse
	command -v python3 >/dev/null || skip "python3 not found"
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	local f=$MNT/ranks/tp01_pp00/model.safetensors
	python3 - "$f" <<-'EOF'
		import mmap, sys
		with open(sys.argv[1], 'rb') as fh:
		    data = fh.read()
		    m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
		    assert m[:] == data and len(data) > 8, 'mmap differs'
	EOF
}

@test "-h documents every flexfs option; -V prints versions" {
	run "$FLEXFS_BIN" -h
	[[ $status -eq 0 ]]
	for opt in tp= pp= rules= layer_regex= embed_regex= pp_renumber \
		hf_shard_size= read_ahead_kb= direct_io cache_size= \
		source_format=; do
		[[ $output == *"-o $opt"* ]]
	done
	[[ $output == *"-o allow_other"* ]] # libfuse's own help follows
	run "$FLEXFS_BIN" --version
	[[ $status -eq 0 && $output == *"flexfs version"* ]]
	[[ $output == *"FUSE library version"* ]]
}

@test "helper personality: mount.flexfs ignores fstab options and daemonizes" {
	require_fuse
	# mount(8)'s -s/-f/-n/-v and -t must not mean single-thread/foreground.
	# A helper that stayed in the foreground would hang here: time out.
	run timeout 20 "$FLEXFS_BUILD/mount.flexfs" "$FIXTURE" "$MNT" -s -f -n -v \
		-o "tp=2,rules=$RULES,noauto,_netdev,nofail,x-systemd.automount,defaults" \
		-t flexfs 3>&-
	echo "$output" >&2
	[[ $status -eq 0 ]]
	mountpoint -q "$MNT"
	FF_DAEMON=$(daemon_pid "$MNT")
	[[ -n $FF_DAEMON ]]
	# fuse_daemonize() made it a session leader of its own.
	[[ $(ps -o sid= -p "$FF_DAEMON" | tr -d ' ') == "$FF_DAEMON" ]]
	[[ $(ls "$MNT/ranks") == $'tp00_pp00\ntp01_pp00' ]]
	fusermount3 -u "$MNT"
	wait_gone "$FF_DAEMON"
	FF_DAEMON=
}

@test "helper personality: mount.fuse3 'flexfs#SRC' daemonizes" {
	require_fuse
	command -v mount.fuse3 >/dev/null || [[ -x /sbin/mount.fuse3 ]] ||
		skip "mount.fuse3 not found"
	run timeout 20 env PATH="$PATH:/sbin:/usr/sbin" mount.fuse3 \
		"$FLEXFS_BIN#$FIXTURE" "$MNT" -o "tp=2,rules=$RULES,nofail" 3>&-
	echo "$output" >&2
	[[ $status -eq 0 ]]
	mountpoint -q "$MNT"
	FF_DAEMON=$(daemon_pid "$MNT")
	[[ -n $FF_DAEMON ]]
	[[ $(ls "$MNT/ranks") == $'tp00_pp00\ntp01_pp00' ]]
	fusermount3 -u "$MNT"
	wait_gone "$FF_DAEMON"
	FF_DAEMON=
}

@test "mount -t flexfs and -t fuse.flexfs find the /sbin helper" {
	require_fuse
	require_sbin_helper
	local type
	for type in flexfs fuse.flexfs; do
		run timeout 20 mount -t "$type" "$FIXTURE" "$MNT" \
			-o "tp=2,rules=$RULES,noauto,nofail,_netdev" 3>&-
		echo "$type: $output" >&2
		[[ $status -eq 0 ]]
		FF_DAEMON=$(daemon_pid "$MNT")
		[[ $(findmnt -n -o FSTYPE "$MNT") == fuse.flexfs ]]
		[[ -f $MNT/ranks/tp01_pp00/model.safetensors ]]
		umount "$MNT"
		wait_gone "$FF_DAEMON"
		FF_DAEMON=
	done
}

@test "an fstab line mounts with mount -T (a private fstab)" {
	require_fuse
	require_sbin_helper
	local fstab=$BATS_TEST_TMPDIR/fstab
	printf '%s %s flexfs %s 0 0\n' "$FIXTURE" "$MNT" \
		"tp=2,rules=$RULES,noauto,nofail,_netdev,x-systemd.automount,comment=x,defaults" \
		>"$fstab"
	run timeout 20 mount -T "$fstab" "$MNT" 3>&-
	echo "$output" >&2
	[[ $status -eq 0 ]]
	FF_DAEMON=$(daemon_pid "$MNT")
	[[ $(ls "$MNT/ranks") == $'tp00_pp00\ntp01_pp00' ]]
	findmnt -n -o OPTIONS "$MNT" | grep -Eq '(^|,)ro(,|$)'
	umount "$MNT"
	wait_gone "$FF_DAEMON"
	FF_DAEMON=
}

@test "a bad option value fails before mounting and names the option" {
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o tp=0 3>&-
	assert_one_line_error "flexfs: " tp
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o pp=abc 3>&-
	assert_one_line_error "flexfs: " pp
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o read_ahead_kb=4M 3>&-
	assert_one_line_error "flexfs: " read_ahead_kb
	run --separate-stderr "$FLEXFS_BUILD/mount.flexfs" "$FIXTURE" "$MNT" \
		-o tp=-1,noauto 3>&-
	assert_one_line_error "flexfs: " tp
}

@test "an unknown option is rejected by libfuse" {
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o "tp=2,rules=$RULES,tpp=3" 3>&-
	assert_one_line_error "fuse: " "tpp=3"
}

@test "a missing checkpoint directory or mountpoint is an error" {
	run --separate-stderr "$FLEXFS_BIN" "$BATS_TEST_TMPDIR/nope" "$MNT" 3>&-
	assert_one_line_error "flexfs: " "nope" "No such file or directory"
	run --separate-stderr "$FLEXFS_BIN" "$BATS_TEST_TMPDIR" "$MNT" 3>&-
	assert_one_line_error "flexfs: "
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" \
		"$BATS_TEST_TMPDIR/no-mnt" -o "tp=2,rules=$RULES" 3>&-
	assert_one_line_error "fuse: " "no-mnt"
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" 3>&-
	assert_one_line_error "flexfs: " MOUNTPOINT
}

# A mount onto the checkpoint directory, or inside it, would hide the files
# it serves: refused before mounting, by both personalities.
@test "a mount point inside the checkpoint directory is refused" {
	local ck=$BATS_TEST_TMPDIR/ckpt
	cp -a "$FIXTURE" "$ck"
	mkdir "$ck/sub"
	run --separate-stderr "$FLEXFS_BIN" "$ck" "$ck" -o "tp=2,rules=$RULES" 3>&-
	assert_one_line_error "flexfs: " "$ck: the mount point is inside the checkpoint directory $ck"
	not_mounted "$ck"
	run --separate-stderr "$FLEXFS_BIN" "$ck/" "$ck/sub/../sub" \
		-o "tp=2,rules=$RULES" 3>&-
	assert_one_line_error "flexfs: " "$ck/sub: the mount point is inside"
	not_mounted "$ck/sub"
	run --separate-stderr "$FLEXFS_BUILD/mount.flexfs" "$ck" "$ck/sub" \
		-o "tp=2,rules=$RULES" 3>&-
	assert_one_line_error "flexfs: " "inside the checkpoint directory"
	not_mounted "$ck/sub"
	# beside it is fine
	mount_ff "$ck" "$MNT" "tp=2,rules=$RULES"
	[[ -f $MNT/index.json ]]
	unmount_ff "$MNT"
}

@test "a mount point inside the checkpoint reached through another name (a bind mount) is refused" {
	local ck=$BATS_TEST_TMPDIR/ckpt alias=$BATS_TEST_TMPDIR/alias
	cp -a "$FIXTURE" "$ck"
	mkdir "$ck/sub" "$alias"
	if ! mount --bind "$ck" "$alias" 2>/dev/null; then
		skip "mount --bind is not allowed here"
	fi
	run --separate-stderr "$FLEXFS_BIN" "$alias" "$ck/sub" -o "tp=2,rules=$RULES" 3>&-
	umount "$alias" || true
	not_mounted "$ck/sub"
	assert_one_line_error "flexfs: " "$ck/sub: the mount point is inside the checkpoint directory $alias"
}

@test "a bad rules file is an error naming the file and the problem" {
	local bad=$BATS_TEST_TMPDIR/bad.json typo=$BATS_TEST_TMPDIR/typo.json
	echo '[{"match": "block.weight", "split": 1,]' >"$bad"
	echo '[{"match": "block.weight", "axis": 1}]' >"$typo"
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o "tp=2,rules=$bad" 3>&-
	assert_one_line_error "flexfs: " "$bad" "JSON"
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o "tp=2,rules=$typo" 3>&-
	assert_one_line_error "flexfs: " "$typo" "axis"
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" \
		-o "tp=2,rules=$BATS_TEST_TMPDIR/absent.json" 3>&-
	assert_one_line_error "flexfs: " "absent.json"
}

@test "a 2-D block-sharded tensor without a rule is refused by name" {
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o tp=2 3>&-
	assert_one_line_error "flexfs: " "block.weight"
	# (with rules.json the same checkpoint mounts: every test above)
}

@test "flexfs-inspect prints the plan and reports the same errors" {
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o "tp=2,rules=$RULES"
	[[ $status -eq 0 ]]
	[[ ${lines[0]} == TENSOR* ]]
	[[ $output == *block.weight*"r0-1: 8x6"* ]]
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" --json \
		-o "tp=2,rules=$RULES"
	[[ $status -eq 0 && ${lines[0]} == "{" ]]
	# an undecided split: the table, then the list (usability.bats)
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o tp=2
	[[ $status -eq 1 && ${lines[0]} == TENSOR* ]]
	[[ $stderr == *"block.weight"* ]]
	# the mount's errors, one line
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o "tp=2,pp=0"
	assert_one_line_error "flexfs-inspect: " "pp"
}

@test "src_strategy= on a source that takes no strategy file is refused, not ignored" {
	local st=$FLEXFS_SRC/tests/fixtures/mindspore-pp2/strategy/ckpt_strategy_rank_0.ckpt
	run --separate-stderr "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/hf-tiny/single" -o "src_strategy=$st"
	[ "$status" -eq 1 ]
	[[ $stderr == *"src_strategy: src_strategy= is given but the source is hf-safetensors, which does not read it (an option of the mindspore source)" ]]
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -f -o "src_strategy=$st" 3>&-
	assert_one_line_error "flexfs: " "src_strategy= is given but the source is torch-dcp, which does not read it (an option of the mindspore source)"
	not_mounted "$MNT"
}
