#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# megatron/ for MoE sources with megatron_spec=te: the experts' FP8
# _extra_state blobs (items "...experts.experts.<fc>._extra_state/
# shard_<l>.<e>_<L>.<E>", tests/fixtures/megatron-moe-fp8), and
# TEGroupedMLP names (args.moe_grouped_gemm: "mlp.experts.linear_fc1.weight<e>",
# "_extra_state" for expert 0, "_extra_state<e>" for the others; docs/formats/megatron.md#moe-experts,
# docs/formats/megatron.md#stage-local-layer-numbering).  Oracle: tools/fixtures/gen_megatron.py legacy, compared by
# tests/bats/lib/check_megatron_legacy.py.
# tp 1 targets of these tp 2 saves state the fixtures' true vocab 200
# (megatron_true_vocab; the padding at tp 1 depends on it, docs/facts.md): 256
# rows, as the oracle's re-padding of the saved 256.

load helpers
load megatron_helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron.py
ITER=ckpt/iter_0000100

setup_file() {
	local d=$BATS_FILE_TMPDIR fx
	# the same checkpoints saved by a run with --moe-grouped-gemm
	for fx in megatron-moe megatron-moe-fp8; do
		cp -r "$FX/$fx" "$d/$fx-grouped"
	done
	/usr/bin/python3 - "$GEN" "$MEG_STUB" "$d/megatron-moe-grouped" \
		"$d/megatron-moe-fp8-grouped" <<'PY'
import importlib.util, os, sys
sys.path.insert(0, sys.argv[2])
spec = importlib.util.spec_from_file_location("g", sys.argv[1])
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)
import torch
for src in sys.argv[3:]:
    c = g.load_common(src)
    c["args"].moe_grouped_gemm = True
    torch.save(c, os.path.join(src, "ckpt", g.ITER_DIR, "common.pt"))
PY
	# fixtures of the tree and the grouped copies side by side
	for fx in megatron-moe megatron-moe-fp8 megatron-untied megatron-tied \
		megatron-moe-ep-vp megatron-te-fp8; do
		ln -s "$FX/$fx" "$d/$fx"
	done
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$d" "$d" megatron-moe-fp8:2:2:te megatron-moe-fp8:1:2:te \
		megatron-moe-fp8:4:1:te megatron-moe-fp8:2:2:local \
		megatron-moe-grouped:2:2:te megatron-moe-fp8-grouped:2:2:te \
		megatron-moe-fp8-grouped:1:1:te megatron-moe-fp8-grouped:2:2:local \
		megatron-moe-fp8-grouped:2:1:te:ep2 \
		megatron-moe:1:1:local:ep2 megatron-moe:2:2:local:ep4 \
		megatron-moe:2:1:te:ep2:vp2 megatron-moe-fp8:2:1:te:ep2 \
		megatron-untied:2:2:local:vp2 megatron-untied:1:2:te:vp2 \
		megatron-tied:1:1:local:vp2 megatron-tied:2:1:local:vp2 \
		megatron-moe-ep-vp:2:2:local megatron-moe-ep-vp:1:1:te:ep2:vp2 \
		megatron-te-fp8:2:2:local
}

setup() {
	setup_ff
}

teardown() {
	megatron_teardown
	mountpoint -q "$MNT" && fusermount3 -u -z "$MNT"
	teardown_ff
}

# unavailable SRC OPTS WANT: megatron/ holds only unavailable.txt saying WANT.
unavailable() {
	mount_ff "$1" "$MNT" "$2"
	run ls "$MNT/megatron"
	[ "$output" = unavailable.txt ]
	run cat "$MNT/megatron/unavailable.txt"
	echo "$output"
	unmount_ff "$MNT"
	[[ $output == *"$3"* ]]
}

@test "megatron/ te spec, MoE with FP8: each expert linear's blob, the same on every TP rank" {
	local e=$BATS_FILE_TMPDIR/exp-megatron-moe-fp8 src=$FX/megatron-moe-fp8/$ITER
	# the local spec has no TE blobs: None everywhere
	megatron_legacy "$src|tp=2,pp=2,megatron_spec=te|$e-2-2-te" \
		"$src|tp=1,pp=2,megatron_spec=te,megatron_true_vocab=200|$e-1-2-te" \
		"$src|tp=4,pp=1,megatron_spec=te|$e-4-1-te" \
		"$src|tp=2,pp=2|$e-2-2-local"
}

@test "megatron/ te spec with args.moe_grouped_gemm: TEGroupedMLP names, one extra state per expert" {
	local d=$BATS_FILE_TMPDIR
	# the local spec keeps SequentialMLP's names
	megatron_legacy "$d/megatron-moe-grouped/$ITER|tp=2,pp=2,megatron_spec=te|$d/exp-megatron-moe-grouped-2-2-te" \
		"$d/megatron-moe-fp8-grouped/$ITER|tp=2,pp=2,megatron_spec=te|$d/exp-megatron-moe-fp8-grouped-2-2-te" \
		"$d/megatron-moe-fp8-grouped/$ITER|tp=1,pp=1,megatron_spec=te,megatron_true_vocab=200|$d/exp-megatron-moe-fp8-grouped-1-1-te" \
		"$d/megatron-moe-fp8-grouped/$ITER|tp=2,pp=2|$d/exp-megatron-moe-fp8-grouped-2-2-local"
}

@test "megatron/ with megatron_ep: mp_rank_TT[_PPP]_EEE files of the rank's local experts" {
	local d=$BATS_FILE_TMPDIR
	megatron_legacy "$FX/megatron-moe/$ITER|tp=1,pp=1,megatron_ep=2,megatron_true_vocab=200|$d/exp-megatron-moe-1-1-local-ep2" \
		"$FX/megatron-moe/$ITER|tp=2,pp=2,megatron_ep=4|$d/exp-megatron-moe-2-2-local-ep4" \
		"$FX/megatron-moe-fp8/$ITER|tp=2,pp=1,megatron_spec=te,megatron_ep=2|$d/exp-megatron-moe-fp8-2-1-te-ep2" \
		"$d/megatron-moe-fp8-grouped/$ITER|tp=2,pp=1,megatron_spec=te,megatron_ep=2|$d/exp-megatron-moe-fp8-grouped-2-1-te-ep2"
	unavailable "$FX/megatron-moe/$ITER" "megatron_ep=3,megatron_true_vocab=200" \
		"4 experts do not divide into megatron_ep=3 ranks"
	unavailable "$FX/megatron-untied/$ITER" "megatron_ep=2,megatron_true_vocab=200" \
		"megatron_ep: megatron/: expert parallel size 2, but the model has no experts"
}

@test "megatron/ with megatron_vp: model0, model1, ... chunks of Megatron's interleaved layers" {
	local d=$BATS_FILE_TMPDIR
	megatron_legacy "$FX/megatron-untied/$ITER|tp=2,pp=2,megatron_vp=2|$d/exp-megatron-untied-2-2-local-vp2" \
		"$FX/megatron-untied/$ITER|tp=1,pp=2,megatron_spec=te,megatron_vp=2,megatron_true_vocab=200|$d/exp-megatron-untied-1-2-te-vp2" \
		"$FX/megatron-tied/$ITER|tp=1,pp=1,megatron_vp=2,megatron_true_vocab=200|$d/exp-megatron-tied-1-1-local-vp2" \
		"$FX/megatron-tied/$ITER|tp=2,pp=1,megatron_vp=2|$d/exp-megatron-tied-2-1-local-vp2" \
		"$FX/megatron-moe/$ITER|tp=2,pp=1,megatron_spec=te,megatron_vp=2,megatron_ep=2|$d/exp-megatron-moe-2-1-te-ep2-vp2"
	unavailable "$FX/megatron-untied/$ITER" "tp=1,pp=2,megatron_vp=4,megatron_true_vocab=200" \
		"4 layers do not divide into pp=2 x vp=4 chunks"
	mount_refused_line "$FX/megatron-untied/$ITER" megatron_vp=0 \
		"*megatron_vp*expected a size from 1 to 1024, got '0'*"
}

@test "megatron source saved with EP 2 and a virtual pipeline: every view and megatron/ equal the truth" {
	local d=$BATS_FILE_TMPDIR fx=megatron-moe-ep-vp tp
	for tp in 1 2; do
		megatron_views "$FX/$fx" "$FX/$fx/$ITER" "$tp"
	done
	megatron_legacy "$FX/$fx/$ITER|tp=2,pp=2|$d/exp-$fx-2-2-local" \
		"$FX/$fx/$ITER|tp=1,pp=1,megatron_spec=te,megatron_ep=2,megatron_vp=2,megatron_true_vocab=200|$d/exp-$fx-1-1-te-ep2-vp2"
}

@test "megatron/ te spec refuses an older TE's io.BytesIO _extra_state with one line; the local spec serves" {
	# tests/unit/data/megatron-te-bytesio: tools/fixtures/gen_megatron_bytesio.py's
	# overlay on megatron-te-fp8 (layer 1's linear_qkv blob an io.BytesIO)
	local d=$BATS_TEST_TMPDIR/src
	cp -r "$FX/megatron-te-fp8/$ITER" "$d"
	cp -a "$FLEXFS_SRC/tests/unit/data/megatron-te-bytesio/." "$d/"
	mount_refused_line "$d" tp=2,pp=2,megatron_spec=te \
		"*__0_2.distcp@0: decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2: megatron/: TE _extra_state: an io.BytesIO (older TE) is not supported*"
	megatron_legacy "$d|tp=2,pp=2|$BATS_FILE_TMPDIR/exp-megatron-te-fp8-2-2-local"
}

@test "megatron/ te spec: the legacy bytes-key variant (shape one entry short, docs/formats/megatron.md#key-namespaces) finds the experts' FP8 blobs" {
	# tests/unit/data/megatron-legacy-keys: tools/fixtures/gen_megatron_legacy_keys.py's
	# overlay on megatron-moe-fp8 (every shard_<l>.<e>_<L>.<E> key saved as
	# shard_<l>.<e>_<L>, rng_state's likewise)
	local d=$BATS_TEST_TMPDIR/src
	cp -r "$FX/megatron-moe-fp8/$ITER" "$d"
	cp -a "$FLEXFS_SRC/tests/unit/data/megatron-legacy-keys/." "$d/"
	megatron_legacy "$d|tp=2,pp=2,megatron_spec=te|$BATS_FILE_TMPDIR/exp-megatron-moe-fp8-2-2-te" \
		"$d|tp=1,pp=2,megatron_spec=te,megatron_true_vocab=200|$BATS_FILE_TMPDIR/exp-megatron-moe-fp8-1-2-te"
	mount_ff "$d" "$MNT" "tp=2"
	[ -f "$MNT/objects/decoder.layers.mlp.experts.experts.linear_fc1._extra_state%2Fshard_1.3_2.pt" ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}
