#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Slow (ctest -L slow after -DFLEXFS_SLOW_TESTS=ON; about two minutes of a
# quiet machine, most of it torch writing and reading 4 GiB): the ZIP64
# records of a rank's model.pt.  The zip reader's ZIP64 parsing is
# covered in CI by test_zipitem; this is the writer's side, end to end.

load ../helpers

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# A rank's model.pt past 4 GiB: ZIP64 sizes and offsets, from a sparse
# 4 GiB safetensors source.  torch 1.13 loads it and it equals torch's own
# zip writer's file for the same records (lib/check_pt_big.py); torch 2.6
# loads it with mmap when the trixie chroot exists.
@test "model.pt past 4 GiB (ZIP64) equals torch's writer and loads" {
	local big=$BATS_TEST_TMPDIR/big
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/check_pt_big.py" make "$big"
	mount_ff "$big" "$MNT" "tp=1"
	[ "$(stat -c %s "$MNT/ranks/tp00_pp00/model.pt")" -gt 4294967296 ]
	TMPDIR=$BATS_TEST_TMPDIR run /usr/bin/python3 \
		"$FLEXFS_SRC/tests/bats/lib/check_pt_big.py" check \
		"$MNT/ranks/tp00_pp00/model.pt" --ref
	echo "$output"
	unmount_ff "$MNT"
	[ "$status" -eq 0 ]
	[[ $output == ok ]]
	[[ -x $CHROOT/usr/bin/python3 ]] || return 0
	local inner=/tmp/flexfs-bats-big-$$
	mkdir -p "$CHROOT$inner/mnt"
	cp "$FLEXFS_SRC/tests/bats/lib/check_pt_big.py" "$CHROOT$inner/"
	MNT=$CHROOT$inner/mnt
	mount_ff "$big" "$MNT" "tp=1"
	run chroot "$CHROOT" python3 "$inner/check_pt_big.py" check \
		"$inner/mnt/ranks/tp00_pp00/model.pt"
	echo "torch 2.6: $output"
	unmount_ff "$MNT"
	rm -rf "${CHROOT:?}$inner"
	[ "$status" -eq 0 ]
	[[ $output == ok ]]
}
