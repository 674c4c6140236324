#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# megatron/: the legacy per-rank files (docs/formats/megatron.md#legacy-target, docs/formats/megatron.md#legacy-recipe) served from
# the tests/fixtures/megatron-* torch_dist fixtures, torch.load-ed and
# compared key by key (tensors bitwise, args, iteration, version) with the
# files tools/fixtures/gen_megatron.py legacy writes for the same target
# (numpy slices of the truth, saved by torch.save): lib/check_megatron_legacy.py.
# torch 1.13 for tp 1/2/4 x pp 1/2 and both specs; torch 2.6 (trixie chroot,
# when present) with weights_only=True and mmap=True.

load helpers
load megatron_helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron.py
ITER=ckpt/iter_0000100

# grid: FIXTURE:TP:PP[:V] of the three models at tp 1, 2, 4 x pp 1, 2; tp 1
# (not a multiple of the saving tp 2) with the fixtures' true vocab 200,
# which the padding there depends on (docs/facts.md).
grid() {
	local fx tp pp
	for fx in megatron-untied megatron-tied megatron-moe; do
		for tp in 1 2 4; do
			for pp in 1 2; do
				if ((tp == 1)); then
					echo "$fx:$tp:$pp:200"
				else
					echo "$fx:$tp:$pp"
				fi
			done
		done
	done
}

# oracle SPEC FIXTURE:TP:PP[:V]: megatron_oracles.py's FIXTURE:TP:PP:SPEC[:V].
oracle() {
	local fx tp pp v
	IFS=: read -r fx tp pp v <<<"$2"
	echo "$fx:$tp:$pp:$1${v:+:$v}"
}

setup_file() {
	local t=() x
	for x in $(grid) megatron-gpt-bias:1:1:200 megatron-gpt-bias:2:2 \
		megatron-gpt-bias:4:1 megatron-moe-mixed:1:1:200 \
		megatron-moe-mixed:2:2 megatron-te-fp8:2:2 \
		megatron-optim-fully-reshardable:2:2 \
		megatron-optim-dp-reshardable:2:2 \
		megatron-optim-fully-sharded-model-space:1:1:40 \
		megatron-optim-fully-sharded-model-space:2:1 \
		megatron-optim-fully-sharded-model-space:2:2 \
		megatron-optim-fsms-unaligned:2:2; do
		t+=("$(oracle local "$x")")
	done
	t+=("megatron-untied:2:2:te" "megatron-tied:2:2:te" "megatron-moe:2:2:te"
		"megatron-untied:4:1:te"
		"megatron-untied:1:2:local:100" "megatron-tied:1:2:local:100"
		"megatron-te-fp8:1:1:te:40" "megatron-te-fp8:2:2:te"
		"megatron-te-fp8:1:2:te:40" "megatron-gpt-bias:2:2:te"
		"megatron-moe-mixed:2:1:te")
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$FX" "$BATS_FILE_TMPDIR" "${t[@]}"
}

setup() {
	setup_ff
}

teardown() {
	megatron_teardown
	teardown_ff
}

# check_legacy SPEC FIXTURE:TP:PP[:V]...: every target mounted at once (V:
# with megatron_true_vocab=V), each megatron/ compared with its oracle
# (megatron_legacy).
check_legacy() {
	local spec=$1 t fx tp pp v args=()
	shift
	for t in "$@"; do
		IFS=: read -r fx tp pp v <<<"$t"
		args+=("$FX/$fx/$ITER|tp=$tp,pp=$pp,megatron_spec=$spec${v:+,megatron_true_vocab=$v}|$BATS_FILE_TMPDIR/exp-$fx-$tp-$pp-$spec${v:+-$v}")
	done
	megatron_legacy "${args[@]}"
}

@test "megatron/ legacy files equal Megatron's at tp 1,2,4 x pp 1,2 (untied, tied, moe; local spec)" {
	# shellcheck disable=SC2046 # one word a target
	check_legacy local $(grid)
}

@test "megatron/ legacy files of pretrain_gpt's defaults: biases, LayerNorm biases, position embeddings, QK norms" {
	check_legacy local megatron-gpt-bias:1:1:200 megatron-gpt-bias:2:2 \
		megatron-gpt-bias:4:1
	check_legacy te megatron-gpt-bias:2:2
}

@test "megatron/ legacy files of a MoE with a dense first layer (per-layer keys, no layer axis)" {
	check_legacy local megatron-moe-mixed:1:1:200 megatron-moe-mixed:2:2
	check_legacy te megatron-moe-mixed:2:1
}

@test "megatron/ legacy files with megatron_spec=te (fused norms, TE extra states)" {
	check_legacy te megatron-untied:2:2 megatron-tied:2:2 megatron-moe:2:2 \
		megatron-untied:4:1
}

@test "megatron/ with FP8 TE extra states: each layer's blob on every TP rank, stage-local layers" {
	# tp 1 from the saving tp 2: the padding depends on the true vocab 40
	check_legacy te megatron-te-fp8:1:1:40 megatron-te-fp8:2:2 \
		megatron-te-fp8:1:2:40
	# the local spec has no TE blobs: None everywhere
	check_legacy local megatron-te-fp8:2:2
}

@test "megatron/ refuses a malformed TE _extra_state item, naming it" {
	local d=$BATS_TEST_TMPDIR/src f name off
	cp -r "$FX/megatron-te-fp8/$ITER" "$d"
	# in the item of layer 1's linear_fc2, the generator's blob follows its
	# data.pkl: make that pickle's rebuild function one no torch has
	f=$(/usr/bin/python3 - "$d" "$GEN" "$FX/megatron-te-fp8/truth" <<'PY'
import glob, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("g", sys.argv[2])
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)
man = json.load(open(sys.argv[3] + "/manifest.json"))
blob = g.fp8_blob(g.Cfg.from_json("te-fp8", man["config"]),
                  "decoder.layers.mlp.linear_fc2", 1)
for f in sorted(glob.glob(sys.argv[1] + "/*.distcp")):
    data = open(f, "rb").read()
    at = data.find(blob)
    if at >= 0:
        print(os.path.basename(f), data.rfind(b"_rebuild_tensor_v2", 0, at) + 17)
        break
PY
)
	read -r name off <<<"$f"
	[ -n "$off" ]
	printf '9' | dd of="$d/$name" bs=1 seek="$off" conv=notrunc status=none
	mount_refused_line "$d" tp=2,pp=2,megatron_spec=te \
		"*$name@*linear_fc2._extra_state/shard_1_2*_rebuild_tensor_v9*"
}

@test "megatron/ legacy files of the three optimizer layouts: the model only" {
	check_legacy local megatron-optim-fully-reshardable:2:2 \
		megatron-optim-dp-reshardable:2:2 \
		megatron-optim-fully-sharded-model-space:1:1:40 \
		megatron-optim-fully-sharded-model-space:2:1 \
		megatron-optim-fully-sharded-model-space:2:2 \
		megatron-optim-fsms-unaligned:2:2
}

@test "megatron/ with megatron_true_vocab: the tables re-padded from the true vocab (surplus rows dropped)" {
	local fx args=()
	for fx in megatron-untied megatron-tied; do
		args+=("$FX/$fx/$ITER|tp=1,pp=2,megatron_true_vocab=100|$BATS_FILE_TMPDIR/exp-$fx-1-2-local-100")
	done
	megatron_legacy "${args[@]}"
	# a true vocab past the saved rows: nothing to take them from
	mount_ff "$FX/megatron-untied/$ITER" "$MNT" "megatron_true_vocab=300"
	run cat "$MNT/megatron/unavailable.txt"
	unmount_ff "$MNT"
	[[ $output == *"true vocab 300 is larger than the saved 256 rows"* ]]
}

@test "megatron/ legacy files load in torch 2.6 (trixie chroot), weights_only and mmap" {
	[[ -x $CHROOT/usr/bin/python3 ]] ||
		skip "no torch 2.6 chroot at $CHROOT (tools/fixtures/README.md)"
	local inner=/tmp/flexfs-bats-mlg-$$ t fx tp pp v d args=() rc=0
	mkdir -p "$CHROOT$inner"
	cp "$MEG_LEGACY" "$CHROOT$inner/"
	cp -r "$MEG_STUB" "$CHROOT$inner/stub"
	for t in megatron-untied:1:2:200 megatron-tied:4:1 megatron-moe:2:2; do
		IFS=: read -r fx tp pp v <<<"$t"
		d=$inner/m-$fx
		cp -r "$BATS_FILE_TMPDIR/exp-$fx-$tp-$pp-local${v:+-$v}" "$CHROOT$d-exp"
		megatron_mount "$FX/$fx/$ITER" "$CHROOT$d" \
			"tp=$tp,pp=$pp${v:+,megatron_true_vocab=$v}"
		args+=(--mount "$d/megatron" --expected "$d-exp")
	done
	run chroot "$CHROOT" python3 "$inner/check_megatron_legacy.py" \
		"${args[@]}" --stub "$inner/stub" --weights-only --mmap
	echo "$output"
	megatron_unmount_all || rc=1
	rm -rf "${CHROOT:?}$inner"
	[ "$rc" -eq 0 ]
	megatron_legacy_passed
}

@test "megatron/: a target the legacy format cannot express says why in unavailable.txt" {
	mount_ff "$FX/megatron-untied/$ITER" "$MNT" "tp=2,pp=3"
	megatron_unavailable "*num_layers: megatron/: 4 layers do not divide into pp=3 stages*"
	[ -d "$MNT/ranks/tp01_pp02" ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron/: a singleton_local_shards checkpoint says why in unavailable.txt, never guesses its keys" {
	# docs/formats/megatron.md#stacked-layers, docs/formats/megatron.md#legacy-recipe: fc1 saved as weight_w/weight_v, experts per global index
	local d=$BATS_TEST_TMPDIR/sls
	copy_common "$FX/megatron-untied/$ITER" "$d" \
		'c["content_metadata"]["singleton_local_shards"] = True'
	mount_ff "$d" "$MNT" "tp=2,pp=2"
	megatron_unavailable "*content_metadata.singleton_local_shards: megatron/: a singleton_local_shards checkpoint has no legacy layout here*"
	[ -f "$MNT/ranks/tp01_pp01/model.safetensors" ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron: args saved as a plain dict (a reduced state dict) mount; megatron/ writes them as a Namespace" {
	local d=$BATS_TEST_TMPDIR/dictargs m2=$BATS_TEST_TMPDIR/m2 pid
	copy_common "$FX/megatron-untied/$ITER" "$d" \
		'c["args"] = dict(vars(c["args"]))'
	mkdir -p "$m2"
	mount_ff "$d" "$MNT" "tp=4,pp=2"
	pid=$FF_PID
	mount_ff "$FX/megatron-untied/$ITER" "$m2" "tp=4,pp=2"
	run env PYTHONPATH="$MEG_STUB" /usr/bin/python3 -c '
import argparse, sys, torch
f = "/megatron/iter_0000100/mp_rank_03_001/model_optim_rng.pt"
a = torch.load(sys.argv[1] + f, map_location="cpu")
b = torch.load(sys.argv[2] + f, map_location="cpu")
assert isinstance(a["args"], argparse.Namespace), type(a["args"])
assert vars(a["args"]) == vars(b["args"]), "args differ"
assert a["args"].tensor_model_parallel_size == 4 and a["args"].num_layers == 4
assert list(a["model"]) == list(b["model"])
for k, v in a["model"].items():
    assert (v is None and b["model"][k] is None) or torch.equal(v, b["model"][k]), k
print("ok")' "$MNT" "$m2"
	echo "$output"
	[ "$status" -eq 0 ] && [ "$output" = ok ]
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron/ is absent for a source that is not Megatron; megatron_spec=bad is refused" {
	mount_ff "$FX/dcp-t113/ckpt" "$MNT" "tp=1"
	[ ! -e "$MNT/megatron" ]
	unmount_ff "$MNT"
	mount_refused_line "$FX/megatron-untied/$ITER" megatron_spec=bad \
		"*megatron_spec*expected local or te, got 'bad'*"
}

@test "flexfs-inspect shows the megatron/ view: stage-local layers, the layer axis, fc1's two row ranges" {
	run --separate-stderr "$FLEXFS_INSPECT" "$FX/megatron-untied/$ITER" \
		-o tp=2,pp=2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"megatron/iter_0000100/mp_rank_00_001/model_optim_rng.pt (local spec; tp rank 0 of 2"* ]]
	# stage 1's layer 0 is global layer 2: gate rows 0:16 and up rows 32:48
	[[ $output == *"  decoder.layers.0.mlp.linear_fc1.weight  bfloat16 32x16 = decoder.layers.mlp.linear_fc1.weight[2, 0:16, :] ++ [2, 32:48, :]"* ]]
	[[ $output == *"  decoder.layers.1.input_layernorm.weight  bfloat16 16 = decoder.layers.self_attention.linear_qkv.layer_norm_weight[3, :]"* ]]
	run --separate-stderr "$FLEXFS_INSPECT" "$FX/megatron-untied/$ITER" \
		-o tp=2,pp=3
	[ "$status" -eq 0 ]
	[[ $output == *"megatron/: unavailable at this target: num_layers: megatron/: 4 layers do not divide into pp=3 stages"* ]]
}
