#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The Megatron-Core torch_dist source: the tests/fixtures/megatron-*
# fixtures (torch 2.6's DCP writer driven as Megatron-Core 0.15 drives it,
# tools/fixtures/gen_megatron.py: MCoreMetadata, stacked layers, SwiGLU,
# GQA, tied and untied, MoE experts, the three distributed-optimizer
# layouts), each iter_0000100/ mounted at tp 1, 2 and 4 (pp 1) and every
# byte of every view checked by lib/check_views.py against the truth that
# lib/megatron_truth.py stacks from the fixture's per-layer truth (also at
# pp=2, each stage holding its layers of the stacked tensors).  A bad
# metadata.json is refused at mount with one line.

load helpers
load megatron_helpers

FX=$FLEXFS_SRC/tests/fixtures
ITER=ckpt/iter_0000100

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check_megatron FIXTURE TP: every view of FIXTURE's iter_0000100 at tp=TP
# equals the stacked truth (megatron_views).
check_megatron() {
	megatron_views "$FX/$1" "$FX/$1/$ITER" "$2"
}

@test "megatron untied, tied, moe: every view at tp 1,2,4 equals the truth" {
	for fx in megatron-untied megatron-tied megatron-moe; do
		for tp in 1 2 4; do
			check_megatron "$fx" "$tp"
		done
	done
}

@test "megatron with biases, LayerNorm, position embeddings, QK norms: every view at tp 1,2,4 equals the truth" {
	for tp in 1 2 4; do
		check_megatron megatron-gpt-bias "$tp"
	done
}

@test "megatron MoE with a dense first layer (per-layer keys): every view at tp 1,2 equals the truth" {
	check_megatron megatron-moe-mixed 1
	check_megatron megatron-moe-mixed 2
	# the expert axis of a layer's own key is no layer axis: each stage
	# keeps its layers' experts whole
	megatron_views "$FX/megatron-moe-mixed" "$FX/megatron-moe-mixed/$ITER" 2 2
}

@test "megatron optimizer layouts: every view at tp 1 and 2 equals the truth" {
	for fx in megatron-optim-dp-reshardable megatron-optim-fully-reshardable \
		megatron-optim-fully-sharded-model-space; do
		check_megatron "$fx" 1
		check_megatron "$fx" 2
	done
	# fully_sharded_model_space's DP ranges cut rows: several boxes each
	check_megatron megatron-optim-fsms-unaligned 2
}

@test "megatron: index.json names the source; stacked axes are never TP-split" {
	mount_ff "$FX/megatron-moe/$ITER" "$MNT" "tp=2"
	run /usr/bin/python3 - "$MNT/index.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["source"]["format"] == "megatron-torch_dist", d["source"]
assert d["source"]["writer"].startswith("Megatron-Core torch_dist"), d["source"]
t = d["tensors"]
# saved split along layers (0), experts (1) and rows (2): TP takes rows
assert t["decoder.layers.mlp.experts.experts.linear_fc1.weight"]["split_axis"] == 2
# saved split along layers only: replicated
assert t["decoder.layers.mlp.router.weight"]["split_axis"] is None
assert t["decoder.layers.self_attention.linear_qkv.weight"]["split_axis"] == 1
print("ok")
EOF
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron: pp=2 places each stage's layers of the stacked tensors (ranks/, every view)" {
	local t
	for t in megatron-moe:2 megatron-optim-fully-reshardable:1 \
		megatron-optim-fully-sharded-model-space:1 \
		megatron-optim-fully-sharded-model-space:2 \
		megatron-optim-fsms-unaligned:2; do
		megatron_views "$FX/${t%:*}" "$FX/${t%:*}/$ITER" "${t#*:}" 2
	done
}

@test "megatron: metadata.json naming zarr beside a .metadata, or another backend, is refused at mount with one line" {
	local d=$BATS_TEST_TMPDIR/zarr
	cp -a "$FX/megatron-untied/$ITER" "$d"
	printf '{"sharded_backend": "zarr", "sharded_backend_version": 1}' \
		>"$d/metadata.json"
	mount_refused_line "$d" "" \
		"*metadata.json: sharded_backend: 'zarr', but the directory has a .metadata*"
	printf '{"sharded_backend": "tensorstore"}' >"$d/metadata.json"
	mount_refused_line "$d" "" \
		"*metadata.json: sharded_backend: 'tensorstore' is not supported (only torch_dist and zarr checkpoints mount)"
	# -o source_format names either Megatron format: the other's says so
	mount_refused_line "$d" source_format=megatron-zarr \
		"*metadata.json: sharded_backend: 'tensorstore' is not supported*"
	printf '{"sharded_backend": "torch_dist"}' >"$d/metadata.json"
	mount_refused_line "$d" source_format=megatron-zarr \
		"*metadata.json: sharded_backend: 'torch_dist': read it as format megatron-torch_dist, not megatron-zarr"
	mount_refused_line "$FX/megatron-zarr/ckpt/iter_0000100" \
		source_format=megatron-torch_dist \
		"*metadata.json: sharded_backend: 'zarr': read it as format megatron-zarr, not megatron-torch_dist"
}

@test "megatron: flexfs-inspect shows the common state and the stacked tensors" {
	run --separate-stderr "$FLEXFS_INSPECT" "$FX/megatron-moe/$ITER" -o tp=2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"Megatron-Core: iteration 100, checkpoint_version 3.0 (from common.pt); num_layers 2, hidden 16, heads 8, query groups 4, ffn 32 (SwiGLU), padded vocab 256, experts 4; saved at tp=2 pp=2"* ]]
	[[ $output == *"7 stacked tensor(s): axis 0 indexes layers"* ]]
}
