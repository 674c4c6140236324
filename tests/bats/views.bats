#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Every byte of every view, through the real mount, against the ground
# truth written by real torch (1.13 and 2.6 fixtures): ranks/*/model.safetensors,
# ranks/*/tensors/*.npy, hf/ and objects/, for tp in {1,2,3,4,8} x pp in {1,2}.
# The oracle (lib/check_views.py) derives the expected placement itself.

load helpers

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

@test "dcp-t113: tp=1 pp=1 views equal the torch ground truth" { check_views_mount dcp-t113 1 1; }
@test "dcp-t113: tp=1 pp=2 views equal the torch ground truth" { check_views_mount dcp-t113 1 2; }
@test "dcp-t113: tp=2 pp=1 views equal the torch ground truth" { check_views_mount dcp-t113 2 1; }
@test "dcp-t113: tp=2 pp=2 views equal the torch ground truth" { check_views_mount dcp-t113 2 2; }
@test "dcp-t113: tp=3 pp=1 views equal the torch ground truth" { check_views_mount dcp-t113 3 1; }
@test "dcp-t113: tp=3 pp=2 views equal the torch ground truth" { check_views_mount dcp-t113 3 2; }
@test "dcp-t113: tp=4 pp=1 views equal the torch ground truth" { check_views_mount dcp-t113 4 1; }
@test "dcp-t113: tp=4 pp=2 views equal the torch ground truth" { check_views_mount dcp-t113 4 2; }
@test "dcp-t113: tp=8 pp=1 views equal the torch ground truth" { check_views_mount dcp-t113 8 1; }
@test "dcp-t113: tp=8 pp=2 views equal the torch ground truth" { check_views_mount dcp-t113 8 2; }
@test "dcp-t26: tp=1 pp=1 views equal the torch ground truth" { check_views_mount dcp-t26 1 1; }
@test "dcp-t26: tp=1 pp=2 views equal the torch ground truth" { check_views_mount dcp-t26 1 2; }
@test "dcp-t26: tp=2 pp=1 views equal the torch ground truth" { check_views_mount dcp-t26 2 1; }
@test "dcp-t26: tp=2 pp=2 views equal the torch ground truth" { check_views_mount dcp-t26 2 2; }
@test "dcp-t26: tp=3 pp=1 views equal the torch ground truth" { check_views_mount dcp-t26 3 1; }
@test "dcp-t26: tp=3 pp=2 views equal the torch ground truth" { check_views_mount dcp-t26 3 2; }
@test "dcp-t26: tp=4 pp=1 views equal the torch ground truth" { check_views_mount dcp-t26 4 1; }
@test "dcp-t26: tp=4 pp=2 views equal the torch ground truth" { check_views_mount dcp-t26 4 2; }
@test "dcp-t26: tp=8 pp=1 views equal the torch ground truth" { check_views_mount dcp-t26 8 1; }
@test "dcp-t26: tp=8 pp=2 views equal the torch ground truth" { check_views_mount dcp-t26 8 2; }

@test "pp_renumber: stage-local layer names, same bytes" {
	check_views_mount dcp-t113 2 2 pp_renumber --pp-renumber
	check_views_mount dcp-t26 3 2 pp_renumber --pp-renumber
}

# -o direct_io: files opened FOPEN_DIRECT_IO.  check_views.py also maps
# every .npy (np.load mmap_mode='r', MAP_SHARED), which the kernel refuses
# with ENODEV unless the INIT reply allowed mmap of direct-io files.
@test "direct_io: same bytes, mmap included" {
	check_views_mount dcp-t113 3 2 direct_io
	check_views_mount dcp-t26 1 1 direct_io=1
	check_views_mount dcp-t26 4 2 direct_io=0
}

# direct_io is really in effect: a second read of a file reaches the daemon
# (one read of /dev/fuse per request: the daemon's syscr grows by about one
# per 4 KiB read), while without it the page cache serves the re-read.
@test "direct_io: re-reads reach the daemon; without it the page cache serves them" {
	local f=ranks/tp00_pp00/model.safetensors size n0 n1 n2 opts

	for opts in "" direct_io; do
		mount_ff "$FIXTURE" "$MNT" "tp=1,rules=$RULES${opts:+,$opts}"
		size=$(stat -c %s "$MNT/$f")
		n0=$(awk '/^syscr/ {print $2}' "/proc/$FF_PID/io")
		dd if="$MNT/$f" of=/dev/null bs=4k status=none
		n1=$(awk '/^syscr/ {print $2}' "/proc/$FF_PID/io")
		dd if="$MNT/$f" of=/dev/null bs=4k status=none
		n2=$(awk '/^syscr/ {print $2}' "/proc/$FF_PID/io")
		echo "${opts:-page cache}: $size bytes, first read $((n1 - n0))," \
			"re-read $((n2 - n1)) daemon read calls" >&2
		if [[ -n $opts ]]; then
			((n2 - n1 >= size / 4096))
		else
			((n2 - n1 < 4))
		fi
		unmount_ff "$MNT"
		[[ ! -s $FF_ERR ]]
	done
}

@test "hf/ is sharded with an index past hf_shard_size" {
	check_views_mount dcp-t26 1 1 hf_shard_size=1K
	mount_ff "$FLEXFS_SRC/tests/fixtures/dcp-t26/ckpt" "$MNT" "rules=$RULES,hf_shard_size=1K"
	[ -f "$MNT/hf/model.safetensors.index.json" ]
	compgen -G "$MNT/hf/model-00001-of-000[0-9][0-9].safetensors"
	[ ! -e "$MNT/hf/model.safetensors" ]
	unmount_ff "$MNT"
}

# The real safetensors library and torch 2.6 read the views, inside the
# Debian trixie chroot when one exists (tools/fixtures/README.md makes it).
@test "torch 2.6 + real safetensors (trixie chroot) load the views" {
	local src=$FLEXFS_SRC/tests/fixtures/dcp-t26 opts

	chroot_dir "$RULES"
	cp "$src"/truth/* "$CHROOT$CHROOT_IN/truth/"
	# the real library maps the file (safe_open): with direct_io too
	for opts in "" direct_io; do
		chroot_views "$src/ckpt" 4 2 "rules=$RULES${opts:+,$opts}" \
			--real-safetensors
	done
}

# ranks/*/model.pt with torch 2.6 (trixie chroot): torch.load with
# weights_only=True, and mmap=True (the whole file mapped, records sliced at
# their offsets), every tensor against the truth; float8/uint16 tensors
# (_rebuild_tensor_v3) included.  torch 1.13 loads them in every test above.
@test "torch 2.6 (trixie chroot) loads every model.pt, weights_only and mmap" {
	local fx tp pp

	chroot_dir "$RULES"
	for fx in dcp-t113 dcp-t26; do
		rm -rf "$CHROOT$CHROOT_IN/truth"
		mkdir "$CHROOT$CHROOT_IN/truth"
		cp "$FLEXFS_SRC/tests/fixtures/$fx/truth"/* "$CHROOT$CHROOT_IN/truth/"
		for tp in 1 2 4; do
			for pp in 1 2; do
				chroot_views "$FLEXFS_SRC/tests/fixtures/$fx/ckpt" \
					"$tp" "$pp" "rules=$RULES"
			done
		done
	done
}
