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

@test "preset hf-llama-to-paddlenlp-llama-fused: qkv_proj and gate_up_fused_proj as numpy fuses them, per TP rank (tp 1, 2, 4)" {
	require_fuse
	local tp
	for tp in 1 2 4; do
		mount_ff "$HF" "$MNT" "tp=$tp,$TO_PADDLE"
		run /usr/bin/python3 "$ORACLE" check "$MNT" "$HF" paddlenlp-fused $tp
		echo "$output"
		[[ $status -eq 0 && $output == *"checked 21 tensors, 0 wrong"* ]]
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
	run "$FLEXFS_INSPECT" "$M2/hf" --compare "$HF"
	echo "$output"
	[[ $status -eq 0 && $output == *"30 tensor(s) identical, 0 difference(s)"* ]]
	# A = the PaddleNLP fused checkpoint $MNT/hf: to HF ($M2) and back
	mount_ff "$M2/hf" "$M3" "tp=2,$TO_PADDLE"
	run "$FLEXFS_INSPECT" "$M3/hf" --compare "$MNT/hf"
	echo "$output"
	[[ $status -eq 0 && $output == *"21 tensor(s) identical, 0 difference(s)"* ]]
	unmount_ff "$M3"
	FF_PID=$p2
	unmount_ff "$M2"
	FF_PID=$p1
	unmount_ff "$MNT"
}
