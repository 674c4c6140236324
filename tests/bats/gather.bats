#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Tensors torch saved transposed (a .t() view, stride (1, rows)) are served
# by strided gathers through the daemon's block cache (-o cache_size=,
# resolver/cache/bcache.h).  Real torch 1.13 writes the checkpoint once for this
# file (tools/fixtures/gen_dcp.py --model transposed: TP2 x PP2, 1.25 MiB
# transposed chunks, row-parallel transposed chunks, plain ones beside
# them), and every byte of every view is checked against its truth by
# lib/check_views.py: with the default cache, one smaller than a chunk,
# and none; and with readers in parallel on one small cache.

load helpers

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

# check_tposed TP PP [OPTS]: mount, check every view, unmount cleanly.
check_tposed() {
	local tp=$1 pp=$2 opts=${3:-}

	# (no rules: none applies to it, and the mount would say so)
	mount_ff "$TPOSED/ckpt" "$MNT" "tp=$tp,pp=$pp${opts:+,$opts}"
	run /usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/check_views.py" -q \
		--mount "$MNT" --truth "$TPOSED/truth" --tp "$tp" --pp "$pp"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "transposed chunks: every view at tp 1,2,4 x pp 1,2 equals torch's bytes (default cache)" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_tposed "$tp" "$pp"
			# the cache is sized to hold them: nothing to say
			ff_quiet
		done
	done
}

@test "cache_size=1M, smaller than a chunk: a warning at mount, the same bytes" {
	check_tposed 2 1 cache_size=1M
	cat "$FF_ERR"
	grep -q "layers.0.attention.wq.weight is saved with a strided innermost axis (a chunk spans 2 MiB, more than the block cache's 1 MiB)" "$FF_ERR"
	grep -q "mount with -o cache_size=4M" "$FF_ERR"
	[ "$(wc -l <"$FF_ERR")" -eq 1 ]
}

@test "flexfs-inspect names the largest transposed chunk" {
	run --separate-stderr "$FLEXFS_INSPECT" "$TPOSED/ckpt"
	[ "$status" -eq 0 ]
	[[ $output == *"saved transposed (strided innermost axis): largest chunk 1.2 MiB, layers.0.attention.wq.weight;"* ]]
	run --separate-stderr "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/dcp-t113/ckpt" -o "rules=$RULES"
	[[ $output == *"largest chunk 96 B, transposed.weight;"* ]]
}

@test "cache_size=0 (no cache): the same bytes" {
	check_tposed 4 2 cache_size=0
	grep -q "more than the block cache's 0 MiB" "$FF_ERR"
}

@test "parallel readers on a one-block cache (direct_io: every read reaches the daemon)" {
	local bs pid ref=$BATS_TEST_TMPDIR/ref
	local -a pids

	# the reference: one reader on a roomy cache, checked against torch
	check_tposed 1 1
	mount_ff "$TPOSED/ckpt" "$MNT" "tp=1"
	cat "$MNT/hf/model.safetensors" >"$ref"
	unmount_ff "$MNT"
	mount_ff "$TPOSED/ckpt" "$MNT" "tp=2,cache_size=1M,direct_io"
	for round in 1 2; do
		pids=()
		for bs in 4096 12288 65536 1M 3M; do
			dd if="$MNT/hf/model.safetensors" of="$BATS_TEST_TMPDIR/hf.$bs" \
				bs="$bs" status=none &
			pids+=($!)
		done
		# not a bare wait: the daemon is a background job too
		for pid in "${pids[@]}"; do
			wait "$pid"
		done
		for bs in 4096 12288 65536 1M 3M; do
			cmp "$ref" "$BATS_TEST_TMPDIR/hf.$bs"
		done
	done
	run /usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/check_views.py" -q \
		--mount "$MNT" --truth "$TPOSED/truth" --tp 2 --pp 1
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}
