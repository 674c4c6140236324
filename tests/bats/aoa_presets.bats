#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The shipped AOA presets (reshard/presets/*-to-*.json): Megatron-Core
# torch_dist GPT (tests/fixtures/megatron-untied) served under HF Llama
# names and layouts, checked against the fixture's truth by numpy
# (lib/aoa_megatron_check.py); every preset round-trips A -> preset ->
# inverse preset -> A bit for bit through two stacked mounts (flexfs-inspect
# --compare: names, dtypes, shapes, digests); --list-presets lists them.

load helpers

MEG=$FLEXFS_SRC/tests/fixtures/megatron-untied/ckpt/iter_0000100
MEG_TRUTH=$FLEXFS_SRC/tests/fixtures/megatron-untied/truth
PADDLE=$FLEXFS_SRC/tests/fixtures/paddle-flex-p4/ckpt

setup() {
	setup_ff
	M2=$BATS_TEST_TMPDIR/m2
	mkdir -p "$M2"
}

teardown() {
	teardown_ff
}

# round_trip SRC OPTS1 OPTS2: SRC through OPTS1, its hf/ through OPTS2;
# $output: flexfs-inspect --compare of the result with SRC.
round_trip() {
	local p1

	mount_ff "$1" "$MNT" "$2"
	p1=$FF_PID
	mount_ff "$MNT/hf" "$M2" "$3"
	run "$FLEXFS_INSPECT" "$M2/hf" --compare "$1"
	unmount_ff "$M2"
	FF_PID=$p1
	unmount_ff "$MNT"
}

@test "presets: megatron-gpt-to-hf-llama serves HF names and layouts equal to the truth (tp 1), splits at tp 2" {
	mount_ff "$MEG" "$MNT" "rules=@megatron-gpt-to-hf-llama"
	run /usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/aoa_megatron_check.py" "$MNT" "$MEG_TRUTH"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"checked 39 tensors (4 layers, 8 heads, 4 groups), 0 wrong"* ]]
	unmount_ff "$MNT"
	ff_quiet
	run "$FLEXFS_INSPECT" "$MEG" -o "tp=2,rules=@megatron-gpt-to-hf-llama"
	[ "$status" -eq 0 ]
	[[ $output == *"model.layers.3.self_attn.k_proj.weight  "*"16x16  "*" 0  "*"r0-1: 8x16"* ]]
}

@test "presets: megatron-gpt -> hf-llama -> megatron-gpt is bit-exact through two stacked mounts" {
	round_trip "$MEG" "tp=2,rules=@megatron-gpt-to-hf-llama" \
		"rules=@hf-llama-to-megatron-gpt,aoa_num_heads=8,aoa_num_key_value_groups=4"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"9 tensor(s) identical, 0 difference(s)"* ]]
	# the wrong grouping interleaves other rows: the comparison sees it
	round_trip "$MEG" "rules=@megatron-gpt-to-hf-llama" \
		"rules=@hf-llama-to-megatron-gpt,aoa_num_heads=8,aoa_num_key_value_groups=2"
	[ "$status" -eq 1 ]
	[[ $output == *"decoder.layers.self_attention.linear_qkv.weight"* ]]
}

@test "presets: paddlenlp-llama -> hf-llama -> paddlenlp-llama is bit-exact through two stacked mounts" {
	# new_dtypes=1: the fixture's complex64 tensor goes into each hf/'s
	# safetensors too, so that every tensor makes the round trip
	round_trip "$PADDLE" "tp=2,rules=@paddlenlp-llama-to-hf-llama,new_dtypes=1" \
		"rules=@hf-llama-to-paddlenlp-llama,new_dtypes=1"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"52 tensor(s) identical, 0 difference(s)"* ]]
}

@test "presets: hf-llama -> paddlenlp-llama -> hf-llama and hf-llama -> megatron-gpt -> hf-llama are bit-exact" {
	local hf=$BATS_TEST_TMPDIR/hf

	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/aoa_oracle.py" llama "$hf" 3
	round_trip "$hf" "rules=@hf-llama-to-paddlenlp-llama" \
		"rules=@paddlenlp-llama-to-hf-llama"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" tensor(s) identical, 0 difference(s)"* ]]
	round_trip "$hf" "tp=2,rules=@hf-llama-to-megatron-gpt,aoa_num_heads=8,aoa_num_key_value_groups=2" \
		"rules=@megatron-gpt-to-hf-llama,aoa_num_heads=8,aoa_num_key_value_groups=2"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" tensor(s) identical, 0 difference(s)"* ]]
}

@test "presets: --list-presets lists the AOA presets with their notes" {
	run "$FLEXFS_INSPECT" --list-presets
	[ "$status" -eq 0 ]
	for p in megatron-gpt-to-hf-llama hf-llama-to-megatron-gpt \
		paddlenlp-llama-to-hf-llama hf-llama-to-paddlenlp-llama \
		paddlenlp-llama-fused-to-hf-llama hf-llama-to-paddlenlp-llama-fused; do
		[[ $output == *"@$p "*"to "*"names and layouts"* ]]
	done
}

@test "presets: Paddle optimizer states follow their parameter (moments and master weights transposed, beta powers renamed) and round-trip" {
	local np2=$FLEXFS_SRC/tests/fixtures/paddle-flex-np2-sharding/ckpt

	round_trip "$np2" "tp=2,rules=@paddlenlp-llama-to-hf-llama" \
		"rules=@hf-llama-to-paddlenlp-llama"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"126 tensor(s) identical, 0 difference(s)"* ]]
	mount_ff "$np2" "$MNT" "rules=@paddlenlp-llama-to-hf-llama"
	p1=$FF_PID
	mount_ff "$np2" "$M2"
	run /usr/bin/python3 -c '
import sys
sys.path.insert(0, sys.argv[3])
from aoa_oracle import read_st
a = read_st(sys.argv[1] + "/ranks/tp00_pp00/model.safetensors")
b = read_st(sys.argv[2] + "/ranks/tp00_pp00/model.safetensors")
n = 0
for s in ("moment1_0", "moment2_0", "w_0"):
    for i in range(2):
        h = "model.layers.%d.mlp.up_proj.weight.%s" % (i, s)
        p = "llama.layers.%d.mlp.up_proj.weight.%s" % (i, s)
        assert a[h].dtype == b[p].dtype and a[h].equal(b[p].T), h
        n += 1
for s in ("beta1_pow_acc_0", "beta2_pow_acc_0"):
    assert a["lm_head.weight." + s].equal(b["lm_head.weight." + s])
    n += 1
assert not any(k.startswith("llama.") for k in a), "a source name left"
print("ok", n)' "$MNT" "$M2" "$FLEXFS_SRC/tests/bats/lib"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok 8" ]]
	unmount_ff "$M2"
	FF_PID=$p1
	unmount_ff "$MNT"
}
