#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# megatron/ for MoE sources with megatron_spec=te: the experts' FP8
# _extra_state blobs (items "...experts.experts.<fc>._extra_state/
# shard_<l>.<e>_<L>.<E>", tests/fixtures/megatron-moe-fp8), and
# TEGroupedMLP names (args.moe_grouped_gemm: "mlp.experts.linear_fc1.weight<e>",
# "_extra_state" for expert 0, "_extra_state<e>" for the others; spec 3.5,
# 6.3).  Oracle: tools/fixtures/gen_megatron.py legacy, compared by
# tests/bats/lib/check_megatron_legacy.py.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron.py
CHECK=$FLEXFS_SRC/tests/bats/lib/check_megatron_legacy.py
STUB=$FLEXFS_SRC/tools/fixtures/megatron_stub
ITER=ckpt/iter_0000100

setup_file() {
	local d=$BATS_FILE_TMPDIR fx
	# the same checkpoints saved by a run with --moe-grouped-gemm
	for fx in megatron-moe megatron-moe-fp8; do
		cp -r "$FX/$fx" "$d/$fx-grouped"
		/usr/bin/python3 - "$GEN" "$STUB" "$d/$fx-grouped" <<'PY'
import importlib.util, os, sys
sys.path.insert(0, sys.argv[2])
spec = importlib.util.spec_from_file_location("g", sys.argv[1])
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)
import torch
c = g.load_common(sys.argv[3])
c["args"].moe_grouped_gemm = True
torch.save(c, os.path.join(sys.argv[3], "ckpt", g.ITER_DIR, "common.pt"))
PY
	done
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$FX" "$d" megatron-moe-fp8:2:2:te megatron-moe-fp8:1:2:te \
		megatron-moe-fp8:4:1:te megatron-moe-fp8:2:2:local
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$d" "$d" megatron-moe-grouped:2:2:te \
		megatron-moe-fp8-grouped:2:2:te megatron-moe-fp8-grouped:1:1:te \
		megatron-moe-fp8-grouped:2:2:local
}

setup() {
	setup_ff
}

teardown() {
	mountpoint -q "$MNT" && fusermount3 -u -z "$MNT"
	teardown_ff
}

# check SRC OPTS EXPECTED: SRC mounted with OPTS; its megatron/ passes the
# checker against EXPECTED.
check() {
	mount_ff "$1" "$MNT" "$2"
	run /usr/bin/python3 "$CHECK" --mount "$MNT/megatron" --expected "$3" \
		--stub "$STUB"
	echo "$2: $output"
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
}

@test "megatron/ te spec, MoE with FP8: each expert linear's blob, the same on every TP rank" {
	local t
	for t in 2:2 1:2 4:1; do
		check "$FX/megatron-moe-fp8/$ITER" "tp=${t%:*},pp=${t#*:},megatron_spec=te" \
			"$BATS_FILE_TMPDIR/exp-megatron-moe-fp8-${t%:*}-${t#*:}-te"
	done
	# the local spec has no TE blobs: None everywhere
	check "$FX/megatron-moe-fp8/$ITER" "tp=2,pp=2" \
		"$BATS_FILE_TMPDIR/exp-megatron-moe-fp8-2-2-local"
}

@test "megatron/ te spec with args.moe_grouped_gemm: TEGroupedMLP names, one extra state per expert" {
	local d=$BATS_FILE_TMPDIR
	check "$d/megatron-moe-grouped/$ITER" "tp=2,pp=2,megatron_spec=te" \
		"$d/exp-megatron-moe-grouped-2-2-te"
	check "$d/megatron-moe-fp8-grouped/$ITER" "tp=2,pp=2,megatron_spec=te" \
		"$d/exp-megatron-moe-fp8-grouped-2-2-te"
	check "$d/megatron-moe-fp8-grouped/$ITER" "tp=1,pp=1,megatron_spec=te" \
		"$d/exp-megatron-moe-fp8-grouped-1-1-te"
	# the local spec keeps SequentialMLP's names
	check "$d/megatron-moe-fp8-grouped/$ITER" "tp=2,pp=2" \
		"$d/exp-megatron-moe-fp8-grouped-2-2-local"
}
