#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# -o push_ahead_kb (fs/fuse_ll.c): after a read lands in a tensor, the
# daemon stores the rest of that tensor in the kernel's page cache
# (FUSE_NOTIFY_STORE).  lib/push_probe.py reads one byte at the start of
# every tensor and waits until pages no read asked for are cached; then
# every byte of every view, the pushed pages among them (.npy files through
# np.load(mmap_mode='r')), is checked against the truth by
# lib/check_views.py.  The checkpoint (tools/fixtures/gen_dcp.py --model
# transposed) has chunks of 1.25 MiB, plain ones (pushed from the backing
# files) and transposed ones (pushed from a gather).

load helpers

PY=/usr/bin/python3

setup_file() {
	export TPOSED=$BATS_FILE_TMPDIR/tposed
	gen_transposed "$TPOSED"
}

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# probe_and_check OPTS: mount, push, check every view against the truth.
probe_and_check() {
	require_fuse
	# a readahead of one page leaves most of each tensor to the push
	mount_ff "$TPOSED/ckpt" "$MNT" "tp=2,pp=2,read_ahead_kb=4$1"
	run $PY "$FLEXFS_SRC/tests/bats/lib/push_probe.py" --skip-kb 4 \
		"$MNT"/ranks/*/model.safetensors "$MNT"/ranks/*/tensors/*.npy
	echo "$output"
	PROBE=$output
	run $PY "$FLEXFS_SRC/tests/bats/lib/check_views.py" -q \
		--mount "$MNT" --truth "$TPOSED/truth" --tp 2 --pp 2
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "pushed tensors are cached and byte-identical to the truth" {
	probe_and_check ",push_ahead_kb=1024"
	[[ $PROBE == "pushed 24 of 24 tensors" ]]
}

@test "pushes bounded by push_ahead_kb=64 are byte-identical too" {
	probe_and_check ",push_ahead_kb=64"
	[[ $PROBE == "pushed 24 of 24 tensors" ]]
}

@test "without push_ahead_kb nothing is pushed (the probe can fail)" {
	require_fuse
	mount_ff "$TPOSED/ckpt" "$MNT" "tp=2,pp=2,read_ahead_kb=4"
	run $PY "$FLEXFS_SRC/tests/bats/lib/push_probe.py" --skip-kb 4 \
		"$MNT"/ranks/*/model.safetensors "$MNT"/ranks/*/tensors/*.npy
	echo "$output"
	[ "$status" -eq 1 ]
	[[ $output == "pushed 0 of 24 tensors" ]]
}
