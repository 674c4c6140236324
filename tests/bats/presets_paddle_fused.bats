#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The PaddleNLP fused presets (fuse_attention_qkv, fuse_attention_ffn):
# hf-llama-to-paddlenlp-llama-fused serves qkv_proj (fused_qkv, interleaved
# per KV group) and gate_up_fused_proj (fused_ffn: the merged [gate | up],
# each TP rank [gate_r | up_r]) equal to numpy/torch's own fusing of an HF
# Llama (lib/aoa_oracle.py, case paddlenlp-fused) at tp 1, 2, 4, hf/ the
# same at every tp; both directions round-trip bit for bit through two
# stacked mounts (flexfs-inspect --compare).

load helpers

ORACLE=$FLEXFS_SRC/tests/bats/lib/aoa_oracle.py
HEADS=aoa_num_heads=8,aoa_num_key_value_groups=2
TO_PADDLE=rules=@hf-llama-to-paddlenlp-llama-fused,$HEADS
TO_HF=rules=@paddlenlp-llama-fused-to-hf-llama,$HEADS

setup() {
	setup_ff
	HF=$BATS_TEST_TMPDIR/hf
	/usr/bin/python3 "$ORACLE" llama "$HF" 3
	M2=$BATS_TEST_TMPDIR/m2
	M3=$BATS_TEST_TMPDIR/m3
	mkdir -p "$M2" "$M3"
}

teardown() {
	local d
	for d in "$M3" "$M2"; do
		mountpoint -q "$d" && fusermount3 -u -z "$d"
	done
	teardown_ff
}

# oracle_ok MNT TP: MNT's ranks/ serve every tensor of the paddlenlp-fused
# case of $HF at TP as aoa_oracle.py computes it.
oracle_ok() {
	run /usr/bin/python3 "$ORACLE" check "$1" "$HF" paddlenlp-fused "$2"
	echo "$output"
	[[ $status -eq 0 && $output == *"checked 21 tensors, 0 wrong"* ]]
}

# compared DIR REF N M: flexfs-inspect --compare of DIR with REF finds N
# tensors identical and M different, and exits 0 exactly when M is 0.
compared() {
	run "$FLEXFS_INSPECT" "$1" --compare "$2"
	echo "$output"
	[[ $output == *"$3 tensor(s) identical, $4 difference(s)"* ]]
	if (($4 == 0)); then
		[[ $status -eq 0 ]]
	else
		[[ $status -ne 0 ]]
	fi
}

@test "preset hf-llama-to-paddlenlp-llama-fused: qkv_proj and gate_up_fused_proj as numpy fuses them, per TP rank (tp 1, 2, 4)" {
	require_fuse
	local tp
	for tp in 1 2 4; do
		mount_ff "$HF" "$MNT" "tp=$tp,$TO_PADDLE"
		oracle_ok "$MNT" $tp
		sha256sum <"$MNT/hf/model.safetensors" >"$BATS_TEST_TMPDIR/hf$tp"
		unmount_ff "$MNT"
	done
	# hf/ holds the merged [gate | up] whatever the tp
	cmp "$BATS_TEST_TMPDIR/hf1" "$BATS_TEST_TMPDIR/hf2"
	cmp "$BATS_TEST_TMPDIR/hf1" "$BATS_TEST_TMPDIR/hf4"
	# a plain split of gate_up_fused_proj is not PaddleNLP's per-rank layout
	sed 's/, "groups": 2//' "$FLEXFS_SRC/reshard/presets/hf-llama-to-paddlenlp-llama-fused.json" \
		>"$BATS_TEST_TMPDIR/plain.json"
	mount_ff "$HF" "$MNT" "tp=2,rules=$BATS_TEST_TMPDIR/plain.json,$HEADS"
	run /usr/bin/python3 "$ORACLE" check "$MNT" "$HF" paddlenlp-fused 2
	echo "$output"
	[[ $status -ne 0 && $output == *"differs llama.layers.0.mlp.gate_up_fused_proj.weight"* ]]
	unmount_ff "$MNT"
}

@test "presets: hf-llama -> paddlenlp-llama-fused -> hf-llama and paddlenlp-llama-fused -> hf-llama -> paddlenlp-llama-fused are bit-exact" {
	require_fuse
	local p1 p2
	# A = HF: through the preset at tp 2, its hf/ through the inverse
	mount_ff "$HF" "$MNT" "tp=2,$TO_PADDLE"
	p1=$FF_PID
	mount_ff "$MNT/hf" "$M2" "$TO_HF"
	p2=$FF_PID
	compared "$M2/hf" "$HF" 30 0
	# A = the PaddleNLP fused checkpoint $MNT/hf: to HF ($M2) and back
	mount_ff "$M2/hf" "$M3" "tp=2,$TO_PADDLE"
	compared "$M3/hf" "$MNT/hf" 21 0
	unmount_ff "$M3"
	FF_PID=$p2
	unmount_ff "$M2"
	FF_PID=$p1
	unmount_ff "$MNT"
}

# paddle_tp DIR TP: the PaddleNLP fused checkpoint of $HF
# (aoa_oracle.py's paddlenlp-fused tensors at TP, gate_up_fused_proj's
# global tensor [gate_0 | up_0 | gate_1 | up_1 | ...]) saved as a Paddle
# Flex Checkpoint by TP simulated ranks, each its column or row block
# (tools/fixtures/gen_paddle.py's save_state_dict, nothing of flexfs).
paddle_tp() {
	/usr/bin/python3 - "$FLEXFS_SRC" "$HF" "$1" "$2" <<'PY'
import sys
src, hf, out, tp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path[:0] = [src + "/tests/bats/lib", src + "/tools/fixtures"]
import aoa_oracle as o
import gen_paddle as gp
import torch

exp = o.expected(o.read_st(hf + "/model.safetensors"), "paddlenlp-fused", tp)
DTN = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def axis(k):
    if k == "lm_head.weight" or k.endswith(("qkv_proj.weight",
                                            "gate_up_fused_proj.weight")):
        return 1
    if k.endswith(("o_proj.weight", "down_proj.weight", "embed_tokens.weight")):
        return 0
    return None


ranks = []
for r in range(tp):
    sd = {}
    for i, (k, t) in enumerate(exp.items()):
        a, ax = o.to_np(t.contiguous()), axis(k)
        off, shp = [0] * a.ndim, list(a.shape)
        if ax is not None:
            off[ax], shp[ax] = r * a.shape[ax] // tp, a.shape[ax] // tp
        sd[k] = gp.SW(k, gp.Tensor(gp.take(a, off, shp), f"param_{i}"),
                      DTN[t.dtype], tuple(off), tuple(shp), a.shape,
                      dist=ax is not None)
    ranks.append(sd)
gp.save_state_dict(ranks, out, 0, dict(gp.FLEX26, protocol=4))
PY
}

@test "preset paddlenlp-llama-fused-to-hf-llama: a fused tensor saved at TP 2 is refused without aoa_src_tp, bit-exact with aoa_src_tp=2" {
	require_fuse
	local pd=$BATS_TEST_TMPDIR/pd2
	paddle_tp "$pd" 2
	# gate_up_fused_proj in 2 column pieces, src_tp unset: one line, no
	# mount
	mount_refused_line "$pd" "$TO_HF" \
		"*'llama.layers.0.mlp.gate_up_fused_proj.weight' is saved in 2 equal pieces along axis 1*pass -o aoa_src_tp=2*"
	# the degree given: every HF tensor bit for bit (qkv_proj, interleaved
	# per KV group, is the same at any TP and needs nothing)
	mount_ff "$pd" "$MNT" "$TO_HF,aoa_src_tp=2"
	compared "$MNT/hf" "$HF" 30 0
	unmount_ff "$MNT"
	# a statement's own src_tp= is the same
	sed 's/fused_ffn"/fused_ffn, src_tp=2"/' \
		"$FLEXFS_SRC/reshard/presets/paddlenlp-llama-fused-to-hf-llama.json" \
		>"$BATS_TEST_TMPDIR/src2.json"
	mount_ff "$pd" "$MNT" "rules=$BATS_TEST_TMPDIR/src2.json,$HEADS"
	compared "$MNT/hf" "$HF" 30 0
	unmount_ff "$MNT"
	# aoa_src_tp=1 is trusted: it mounts, reading [g0|u0|g1|u1] as merged
	mount_ff "$pd" "$MNT" "$TO_HF,aoa_src_tp=1"
	compared "$MNT/hf" "$HF" 24 6
	unmount_ff "$MNT"
}

@test "presets: HF -> PaddleNLP fused per-rank layout at tp 2 (no dst_tp=1) -> HF is bit-exact with aoa_src_tp=2" {
	require_fuse
	local p1
	# the fused_ffn target laid out for tp 2 as a whole tensor, as PaddleNLP
	# at TP 2 holds it: [gate_0 | up_0 | gate_1 | up_1]
	sed -e 's/, dst_tp=1//' -e 's/, "groups": 2//' \
		"$FLEXFS_SRC/reshard/presets/hf-llama-to-paddlenlp-llama-fused.json" \
		>"$BATS_TEST_TMPDIR/tp2.json"
	mount_ff "$HF" "$MNT" "tp=2,rules=$BATS_TEST_TMPDIR/tp2.json,$HEADS"
	p1=$FF_PID
	oracle_ok "$MNT" 2
	mount_ff "$MNT/hf" "$M2" "$TO_HF,aoa_src_tp=2"
	compared "$M2/hf" "$HF" 30 0
	unmount_ff "$M2"
	FF_PID=$p1
	unmount_ff "$MNT"
}
