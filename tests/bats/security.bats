#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Read-only, for real: the checkpoint directory is byte-for-byte and
# metadata-for-metadata unchanged by mounting and reading every view; the
# whole tree of a 0644/0755 checkpoint is 0444/0555 (perms.bats: other
# modes); the mount is ro,nosuid,nodev and only
# allow_other when asked; every modifying system call fails with the exact
# errno (EROFS; EXDEV where the VFS refuses a cross-mount rename first).
# (mount.bats checks the shell-level messages and a few modes; this file
# checks errno values, the whole tree and the source directory.)

load helpers

CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py
PY=/usr/bin/python3

setup() {
	setup_ff
	require_fuse
	FF_STRICT_STDERR=1
	SHARED_MNT=
}

teardown() {
	teardown_ff
	if [[ -n $SHARED_MNT ]]; then
		mountpoint -q "$SHARED_MNT" && fusermount3 -u -z "$SHARED_MNT"
		rmdir "$SHARED_MNT" "$(dirname "$SHARED_MNT")" 2>/dev/null || true
	fi
}

# private_copy FIXTURE: a copy of the fixture's checkpoint in CK (so that
# nothing of the repository is at stake and atimes do not matter).
private_copy() {
	CK=$BATS_TEST_TMPDIR/$1/ckpt
	mkdir -p "$(dirname "$CK")"
	cp -a "$FLEXFS_SRC/tests/fixtures/$1/ckpt" "$CK"
}

# manifest DIR: every entry (dot files included) with type, mode, size,
# mtime, ctime, inode, link count and owner, then the sha256 of every file.
manifest() {
	(
		cd "$1" || exit 1
		find . -printf '%p\t%y\t%m\t%s\t%T@\t%C@\t%i\t%n\t%U:%G\n' | LC_ALL=C sort
		find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
	)
}

# read_everything MNT: every file of the tree, three ways: cat, mmap,
# and 4 KiB preads from the end backwards.
read_everything() {
	find "$1" -type f -exec cat {} + >/dev/null
	"$PY" - "$1" <<-'EOF'
		import mmap, os, sys
		n = 0
		for d, _, files in os.walk(sys.argv[1]):
		    for f in files:
		        fd = os.open(os.path.join(d, f), os.O_RDONLY)
		        size = os.fstat(fd).st_size
		        if size:
		            m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
		            data = m[:]
		            m.close()
		            for off in range(((size - 1) // 4096) * 4096, -1, -4096):
		                assert os.pread(fd, 4096, off) == data[off:off + 4096], f
		        os.close(fd)
		        n += 1
		assert n > 10, n
	EOF
}

# modes_ok MNT: only regular files (0444) and directories (0555), all the
# way down, and nothing else (no symlink, device, fifo, socket).
modes_ok() {
	local bad
	bad=$(find "$1" \( -type f ! -perm 0444 -printf '%y %m %p\n' \) -o \
		\( -type d ! -perm 0555 -printf '%y %m %p\n' \) -o \
		\( ! -type f ! -type d -printf '%y %m %p\n' \))
	echo "$bad"
	[ -z "$bad" ]
	[ "$(find "$1" -type f | wc -l)" -gt 10 ]
	[ "$(stat -c %a "$1")" = 555 ]
}

# mountinfo_field MNT N: field N of MNT's /proc/self/mountinfo line, N
# counted from the end for the filesystem part (-1 super options, -2
# source, -3 type) and from the start for the mount part (6: options).
mountinfo_field() {
	awk -v m="$1" -v n="$2" '$5 == m {
		if (n < 0) print $(NF + n + 1); else print $n }' /proc/self/mountinfo
}

has_opt() { [[ ",$1," == *",$2,"* ]]; }
lacks_opt() { ! has_opt "$@"; }

@test "the checkpoint is unchanged (bytes, sizes, modes, times, inodes, names) after mounts and full reads" {
	local fx before after cwd=$BATS_TEST_TMPDIR/cwd
	mkdir -p "$cwd"
	for fx in dcp-t113 dcp-t26; do
		private_copy "$fx"
		before=$(manifest "$CK")
		# the daemon's working directory stays empty too
		cd "$cwd"
		mount_ff "$CK" "$MNT" "tp=3,pp=2,rules=$RULES"
		cd "$BATS_TEST_TMPDIR"
		run "$PY" "$CHECK" -q --mount "$MNT" \
			--truth "$FLEXFS_SRC/tests/fixtures/$fx/truth" --tp 3 --pp 2 \
			--rules "$RULES"
		echo "$output"
		[ "$status" -eq 0 ]
		read_everything "$MNT"
		unmount_ff "$MNT"
		[ "$FF_RC" -eq 0 ]
		mount_ff "$CK" "$MNT" "tp=1,rules=$RULES,hf_shard_size=1K,pp_renumber"
		read_everything "$MNT"
		unmount_ff "$MNT"
		[ "$FF_RC" -eq 0 ]
		run "$FLEXFS_INSPECT" "$CK" --json -o "tp=2,pp=2,rules=$RULES"
		[ "$status" -eq 0 ]
		after=$(manifest "$CK")
		diff <(echo "$before") <(echo "$after")
		[ "$(echo "$after" | grep -c distcp)" -ge 8 ]
		# and the private copy still equals the repository's fixture
		diff -r "$CK" "$FLEXFS_SRC/tests/fixtures/$fx/ckpt"
	done
	[ -z "$(ls -A "$cwd")" ]
}

@test "every file is 0444 and every directory 0555, throughout the tree" {
	local opts
	for opts in "tp=3,pp=2" "tp=1,hf_shard_size=1K" "tp=8,pp=2,pp_renumber"; do
		mount_ff "$FIXTURE" "$MNT" "$opts,rules=$RULES"
		modes_ok "$MNT"
		unmount_ff "$MNT"
		mount_ff "$FLEXFS_SRC/tests/fixtures/dcp-t26/ckpt" "$MNT" "$opts,rules=$RULES"
		modes_ok "$MNT"
		unmount_ff "$MNT"
	done
}

@test "mountinfo: ro, nosuid, nodev, fuse.flexfs, no allow_other; -o rw is still ro" {
	local o
	for o in "" ",rw"; do
		mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES$o"
		grep " $MNT " /proc/self/mountinfo
		[ "$(mountinfo_field "$MNT" -3)" = fuse.flexfs ]
		o=$(mountinfo_field "$MNT" 6)
		has_opt "$o" ro
		has_opt "$o" nosuid
		has_opt "$o" nodev
		lacks_opt "$o" rw
		o=$(mountinfo_field "$MNT" -1)
		has_opt "$o" ro
		has_opt "$o" default_permissions
		lacks_opt "$o" allow_other
		# statvfs agrees
		"$PY" -c 'import os, sys; f = os.statvfs(sys.argv[1]).f_flag
assert f & os.ST_RDONLY and f & os.ST_NOSUID and f & os.ST_NODEV, f' "$MNT"
		unmount_ff "$MNT"
	done
}

@test "allow_other: absent, other users are refused; given, they can read (and still not write)" {
	command -v setpriv >/dev/null || skip "setpriv not found"
	[[ $(id -u) == 0 ]] || skip "needs root to act as another user"
	local dir
	# a mountpoint another user can reach (bats's own tmpdir is 0700)
	dir=$(mktemp -d /tmp/flexfs-security.XXXXXX)
	chmod 755 "$dir"
	SHARED_MNT=$dir/mnt
	mkdir "$SHARED_MNT"
	chmod 755 "$SHARED_MNT"
	as_nobody() {
		setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" -c '
import errno, os, sys
try:
    with open(sys.argv[1], "rb") as f:
        print("read", len(f.read()))
except OSError as e:
    print(errno.errorcode[e.errno])
try:
    os.open(sys.argv[1], os.O_WRONLY)
    print("write OK")
except OSError as e:
    print(errno.errorcode[e.errno])
' "$1"
	}
	MNT=$SHARED_MNT
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	lacks_opt "$(mountinfo_field "$MNT" -1)" allow_other
	run as_nobody "$MNT/index.json"
	echo "without allow_other: $output"
	[ "${lines[0]}" = EACCES ]
	unmount_ff "$MNT"
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES,allow_other"
	has_opt "$(mountinfo_field "$MNT" -1)" allow_other
	has_opt "$(mountinfo_field "$MNT" 6)" ro
	run as_nobody "$MNT/index.json"
	echo "with allow_other: $output"
	[ "${lines[0]}" = "read $(stat -c %s "$MNT/index.json")" ]
	[ "${lines[1]}" = EROFS ]
	unmount_ff "$MNT"
}

@test "every modifying system call fails with the exact errno" {
	local outside=$BATS_TEST_TMPDIR/outside
	mount_ff "$FIXTURE" "$MNT" "tp=2,pp=2,rules=$RULES"
	mkdir -p "$outside"
	echo data >"$outside/file"
	run "$PY" - "$MNT" "$outside" <<-'EOF'
		import errno, mmap, os, shutil, sys
		m, out = sys.argv[1], sys.argv[2]
		f = m + "/index.json"
		d = m + "/ranks/tp00_pp00"
		npy = [os.path.join(d, "tensors", x) for x in os.listdir(d + "/tensors")][0]
		src = out + "/file"
		fails = 0

		def expect(want, what, fn):
		    global fails
		    try:
		        fn()
		        got = "success"
		    except OSError as e:
		        got = errno.errorcode.get(e.errno, str(e.errno))
		    ok = got == want
		    fails += not ok
		    print("%-4s %-28s %s%s" % ("ok" if ok else "FAIL", what, got,
		                               "" if ok else " (want %s)" % want))

		E = "EROFS"
		for path in (f, npy):
		    expect(E, "open O_WRONLY", lambda: os.open(path, os.O_WRONLY))
		    expect(E, "open O_RDWR", lambda: os.open(path, os.O_RDWR))
		    expect(E, "open O_WRONLY|O_APPEND", lambda: os.open(path, os.O_WRONLY | os.O_APPEND))
		    expect(E, "open O_RDONLY|O_TRUNC", lambda: os.open(path, os.O_RDONLY | os.O_TRUNC))
		    expect(E, "truncate", lambda: os.truncate(path, 0))
		    expect(E, "chmod", lambda: os.chmod(path, 0o666))
		    expect(E, "chown", lambda: os.chown(path, 1, 1))
		    expect(E, "utime", lambda: os.utime(path, (0, 0)))
		    expect(E, "setxattr user.", lambda: os.setxattr(path, "user.x", b"1"))
		    expect(E, "setxattr trusted.", lambda: os.setxattr(path, "trusted.x", b"1"))
		    expect(E, "removexattr", lambda: os.removexattr(path, "user.x"))
		    expect(E, "unlink", lambda: os.unlink(path))
		    expect(E, "rename within", lambda: os.rename(path, m + "/moved"))
		    expect(E, "link", lambda: os.link(path, m + "/hard"))
		expect(E, "open O_CREAT", lambda: os.open(m + "/new", os.O_WRONLY | os.O_CREAT, 0o644))
		expect(E, "open O_CREAT in subdir", lambda: os.open(d + "/new", os.O_RDONLY | os.O_CREAT, 0o644))
		expect(E, "open O_TMPFILE", lambda: os.open(m, os.O_WRONLY | os.O_TMPFILE, 0o644))
		expect(E, "mkdir", lambda: os.mkdir(m + "/dir"))
		expect(E, "mkdir in subdir", lambda: os.mkdir(d + "/dir"))
		expect(E, "rmdir", lambda: os.rmdir(d))
		expect(E, "rename dir", lambda: os.rename(d, m + "/ranks/renamed"))
		expect(E, "rename over existing", lambda: os.rename(m + "/hf/config.json", f))
		expect(E, "chmod dir", lambda: os.chmod(d, 0o777))
		expect(E, "chown dir", lambda: os.chown(m, 1, 1))
		expect(E, "symlink", lambda: os.symlink("/etc/passwd", m + "/sym"))
		expect(E, "mkfifo", lambda: os.mkfifo(m + "/fifo"))
		expect(E, "mknod", lambda: os.mknod(m + "/node", 0o600 | 0o020000, os.makedev(1, 3)))
		expect(E, "link into the mount", lambda: os.link(src, m + "/hard"))
		# a rename across mounts is refused by the VFS before any
		# filesystem is asked (rename(2): EXDEV); mv's copy fallback
		# then meets the read-only mount
		expect("EXDEV", "rename into the mount", lambda: os.rename(src, m + "/moved"))
		expect("EXDEV", "rename out of the mount", lambda: os.rename(f, out + "/moved"))
		expect(E, "move into (copy fallback)", lambda: shutil.move(src, m + "/moved"))
		fd = os.open(f, os.O_RDONLY)
		expect(E, "fchmod", lambda: os.fchmod(fd, 0o666))
		expect(E, "fchown", lambda: os.fchown(fd, 1, 1))
		expect("EBADF", "write on an O_RDONLY fd", lambda: os.write(fd, b"x"))
		expect("EINVAL", "ftruncate on an O_RDONLY fd", lambda: os.ftruncate(fd, 0))
		expect("EACCES", "mmap MAP_SHARED PROT_WRITE",
		       lambda: mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE))
		# a private writable mapping is copy-on-write: the file is untouched
		before = os.pread(fd, 64, 0)
		pm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
		pm[0:8] = b"XXXXXXXX"
		pm.close()
		fails += os.pread(fd, 64, 0) != before
		os.close(fd)
		fails += os.access(f, os.W_OK)
		# nothing was created, nothing outside was consumed
		fails += sorted(os.listdir(m)) != ["hf", "index.json", "objects", "ranks"]
		fails += not os.path.isfile(src) or open(src).read() != "data\n"
		print("failures:", fails)
		sys.exit(1 if fails else 0)
	EOF
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"failures: 0"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

# A FIFO (or a device) where a data file or .metadata should be: refused by
# its type in one line, without ever being opened for reading; it used to
# block the mount and flexfs-inspect forever in open().
@test "a FIFO given as rules=, dst_strategy= or src_strategy=: refused at once by the mount and inspect, no hang in open()" {
	local fifo=$BATS_TEST_TMPDIR/fifo opt src fx=$FLEXFS_SRC/tests/fixtures

	mkfifo "$fifo"
	for opt in rules dst_strategy src_strategy; do
		src=$fx/hf-tiny/single
		[[ $opt == src_strategy ]] && src=$fx/mindspore-pp2/ckpt
		run timeout 10 "$FLEXFS_INSPECT" "$src" -o "$opt=$fifo"
		echo "inspect $opt: $status: $output"
		[ "$status" -ne 124 ] && [ "$status" -ne 0 ]
		[[ $output == *"fifo"*"not a regular file"* ]]
		run timeout 10 "$FLEXFS_BIN" "$src" "$MNT" -f -o "$opt=$fifo"
		echo "mount $opt: $status: $output"
		[ "$status" -ne 124 ] && [ "$status" -ne 0 ]
		[[ $output == *"fifo"*"not a regular file"* ]]
		not_mounted "$MNT"
	done
}

@test "a FIFO or device named like a data file or .metadata: refused at once, no hang" {
	local name kind

	for name in __0_3.distcp .metadata; do
		for kind in fifo device; do
			private_copy dcp-t113
			rm "$CK/$name"
			if [[ $kind == fifo ]]; then
				mkfifo "$CK/$name"
			elif ! mknod "$CK/$name" c 1 3; then # /dev/null's numbers
				echo "# no mknod here (not root): devices untested" >&3
				rm -rf "$BATS_TEST_TMPDIR/dcp-t113"
				continue
			fi
			run timeout 10 "$FLEXFS_INSPECT" "$CK"
			echo "inspect $name $kind: $status: $output"
			[ "$status" -eq 1 ]
			[[ $output == *"$name"*"not a regular file"* ]]
			run timeout 10 "$FLEXFS_BIN" "$CK" "$MNT" -f
			echo "mount $name $kind: $status: $output"
			[ "$status" -ne 124 ] && [ "$status" -ne 0 ]
			[[ $output == *"$name"*"not a regular file"* ]]
			not_mounted "$MNT"
			rm -rf "$BATS_TEST_TMPDIR/dcp-t113"
		done
	done
}
