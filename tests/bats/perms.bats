#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Permissions (#17 item 4): every node carries the owner, group and read
# bits of what its bytes come from (the checkpoint directory's search bits,
# the metadata, each backing file; directories: the meet of their entries),
# the mount always has default_permissions, so with allow_other the kernel
# refuses another user exactly what the source refuses them.  The users:
# root (mounts), a second user made here with useradd, and nobody.

load helpers

PY=/usr/bin/python3
OTHER=flexfs-perm2

setup() {
	setup_ff
	require_fuse
	command -v setpriv >/dev/null || skip "setpriv not found"
	[[ $(id -u) == 0 ]] || skip "needs root to act as other users"
	if ! id -u "$OTHER" >/dev/null 2>&1; then
		command -v useradd >/dev/null || skip "useradd not found"
		useradd --system --user-group --no-create-home \
			--shell /usr/sbin/nologin "$OTHER" ||
			id -u "$OTHER" >/dev/null # made meanwhile by another run
	fi
	OUID=$(id -u "$OTHER")
	OGID=$(id -g "$OTHER")
	# a mountpoint other users can reach (bats's own tmpdir is 0700)
	SHARED=$(mktemp -d /tmp/flexfs-perms.XXXXXX)
	chmod 755 "$SHARED"
	MNT=$SHARED/mnt
	mkdir "$MNT"
	CK=$BATS_TEST_TMPDIR/ckpt
	cp -a "$FIXTURE" "$CK"
}

teardown() {
	teardown_ff
	mountpoint -q "$MNT" && fusermount3 -u -z "$MNT"
	rm -rf "$SHARED"
}

# as UID GID FILE...: read each FILE as that user (no supplementary
# groups); prints "read N" or the errno name, one line per file.
as() {
	local uid=$1 gid=$2
	shift 2
	setpriv --reuid="$uid" --regid="$gid" --clear-groups "$PY" -c '
import errno, sys
for p in sys.argv[1:]:
    try:
        with open(p, "rb") as f:
            print("read", len(f.read()))
    except OSError as e:
        print(errno.errorcode[e.errno])
' "$@"
}

# tree_modes MNT: "mode uid:gid path" of every node, sorted.
tree_modes() {
	find "$1" -printf '%m %U:%G %P\n' | LC_ALL=C sort -k3
}

@test "a root-only checkpoint (0700, 0600) is served 0400/0500 root:root: another user reads nothing, even with allow_other" {
	find "$CK" -type f -exec chmod 600 {} +
	chmod 700 "$CK"
	mount_ff "$CK" "$MNT" "tp=2,rules=$RULES,allow_other"
	run tree_modes "$MNT"
	echo "$output" | head -5
	[ "${#lines[@]}" -gt 20 ]
	# every file 0400, every directory 0500, all root's
	[ -z "$(find "$MNT" \( -type f ! -perm 0400 \) -o \
		\( -type d ! -perm 0500 \) -o ! -user 0 -o ! -group 0)" ]
	run as 65534 65534 "$MNT/index.json" "$MNT/ranks/tp00_pp00/model.safetensors"
	echo "nobody: $output"
	[ "${lines[0]}" = EACCES ] && [ "${lines[1]}" = EACCES ]
	# root still reads everything
	find "$MNT" -type f -exec cat {} + >/dev/null
}

@test "a checkpoint of another user (0640) is served as theirs: they read every file, byte for byte; nobody is refused" {
	chown -R "$OUID:$OGID" "$CK"
	find "$CK" -type f -exec chmod 640 {} +
	chmod 750 "$CK"
	mount_ff "$CK" "$MNT" "tp=2,pp=2,rules=$RULES,allow_other"
	[ -z "$(find "$MNT" \( -type f ! -perm 0440 \) -o \
		\( -type d ! -perm 0550 \) -o ! -user "$OUID" -o ! -group "$OGID")" ]
	mapfile -t files < <(find "$MNT" -type f | LC_ALL=C sort)
	[ "${#files[@]}" -gt 20 ]
	run as "$OUID" "$OGID" "${files[@]}"
	[ "$status" -eq 0 ]
	local i
	for i in "${!files[@]}"; do
		[ "${lines[$i]}" = "read $(stat -c %s "${files[$i]}")" ]
	done
	# byte for byte what root reads
	setpriv --reuid="$OUID" --regid="$OGID" --clear-groups \
		cat "${files[@]}" | cmp - <(cat "${files[@]}")
	# a member of the group only (no owner) reads too; nobody does not
	run as 65534 "$OGID" "$MNT/index.json"
	[ "$output" = "read $(stat -c %s "$MNT/index.json")" ]
	run as 65534 65534 "$MNT/index.json"
	[ "$output" = EACCES ]
}

@test "one data file 0600 narrows exactly the files that read it (0400) and the directories holding them (0500)" {
	local f=__0_0.distcp ok=0 narrowed=0 p m
	chmod 600 "$CK/$f"
	mount_ff "$CK" "$MNT" "tp=2,rules=$RULES,allow_other"
	run tree_modes "$MNT"
	echo "$output"
	# the oracle: which files read $f, from the change detection (a
	# changed backing file fails every open that would read it)
	touch "$CK/$f"
	while read -r m p; do
		if cat "$MNT/$p" >/dev/null 2>&1; then
			[ "$m" = 444 ] || { echo "readable, but $m: $p"; false; }
			ok=$((ok + 1))
		else
			[ "$m" = 400 ] || { echo "reads $f, but $m: $p"; false; }
			narrowed=$((narrowed + 1))
		fi
	done < <(find "$MNT" -type f -printf '%m %P\n')
	[ "$ok" -gt 10 ] && [ "$narrowed" -gt 0 ]
	# a directory is 0500 exactly when something below it is 0400
	while read -r m p; do
		if [ -n "$(find "$MNT/$p" -type f -perm 0400 -print -quit)" ]; then
			[ "$m" = 500 ] || { echo "holds a 0400 file, but $m: $p"; false; }
		else
			[ "$m" = 555 ] || { echo "$m: $p"; false; }
		fi
	done < <(find "$MNT" -type d -printf '%m %P\n')
	run as 65534 65534 "$MNT/index.json"
	[ "$output" = EACCES ] # the root directory holds a 0400 file
}

@test "the checkpoint directory's search bits count: 0711 serves 0444, 0700 serves 0400" {
	chmod 711 "$CK"
	mount_ff "$CK" "$MNT" "tp=2,rules=$RULES"
	[ "$(stat -c %a "$MNT/index.json")" = 444 ]
	[ "$(stat -c %a "$MNT")" = 555 ]
	unmount_ff "$MNT"
	chmod 700 "$CK"
	mount_ff "$CK" "$MNT" "tp=2,rules=$RULES"
	[ "$(stat -c %a "$MNT/index.json")" = 400 ]
	[ "$(stat -c %a "$MNT/ranks/tp00_pp00/model.safetensors")" = 400 ]
	[ "$(stat -c %a "$MNT")" = 500 ]
}

@test "files of another user (0600) in a root directory (0755) are served as that user's, 0400: they read them, nobody does not" {
	find "$CK" -type f -exec chown "$OUID:$OGID" {} + -exec chmod 600 {} +
	chmod 755 "$CK"
	mount_ff "$CK" "$MNT" "tp=2,rules=$RULES,allow_other"
	[ -z "$(find "$MNT" \( -type f ! -perm 0400 \) -o \
		\( -type d ! -perm 0500 \) -o ! -user "$OUID" -o ! -group "$OGID")" ]
	run as "$OUID" "$OGID" "$MNT/index.json" "$MNT/ranks/tp00_pp00/model.safetensors"
	echo "$output"
	[ "${lines[0]}" = "read $(stat -c %s "$MNT/index.json")" ]
	[ "${lines[1]}" = "read $(stat -c %s "$MNT/ranks/tp00_pp00/model.safetensors")" ]
	run as 65534 "$OGID" "$MNT/index.json"
	[ "$output" = EACCES ]
}
