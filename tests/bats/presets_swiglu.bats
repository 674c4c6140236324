#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# rules=@megatron-gpt follows the model for linear_fc1: a SwiGLU source (its
# Megatron args say swiglu=True) gives each TP rank Megatron's
# [gate_r; up_r], checked against Megatron's own per-rank files
# (gen_megatron.py legacy) at tp 2 and 4; the same checkpoint with
# swiglu=False in its args (GELU) gets torch.chunk's plain row split of the
# truth (lib/check_swiglu_ranks.py).  hf/ keeps the whole [gate; up];
# index.json names each rank's two parts.  The same for a MoE's experts'
# linear_fc1 (tests/fixtures/megatron-moe: SwiGLU, 4 experts, stacked
# [layer, expert, rows, in]) against Megatron's per-rank local_experts.E.

load helpers

FX=$FLEXFS_SRC/tests/fixtures/megatron-untied
MEG=$FX/ckpt/iter_0000100
MOE=$FLEXFS_SRC/tests/fixtures/megatron-moe/ckpt/iter_0000100
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron.py
CHECK=$FLEXFS_SRC/tests/bats/lib/check_swiglu_ranks.py
STUB=$FLEXFS_SRC/tools/fixtures/megatron_stub

setup_file() {
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$FLEXFS_SRC/tests/fixtures" "$BATS_FILE_TMPDIR" \
		megatron-untied:2:1:local megatron-untied:4:1:local \
		megatron-moe:2:1:local megatron-moe:4:1:local \
		megatron-moe-mixed:2:1:local megatron-moe-mixed:4:1:local \
		megatron-gpt-bias:2:1:local megatron-gpt-bias:4:1:local
	# the GELU twins: the same tensors, args.swiglu False
	mkdir -p "$BATS_FILE_TMPDIR/gelu" "$BATS_FILE_TMPDIR/gelu-moe"
	cp -r "$MEG" "$BATS_FILE_TMPDIR/gelu/"
	cp -r "$MOE" "$BATS_FILE_TMPDIR/gelu-moe/"
	PYTHONPATH=$STUB /usr/bin/python3 -c '
import sys, torch
for d in sys.argv[1:]:
    p = d + "/common.pt"
    c = torch.load(p, map_location="cpu")
    c["args"].swiglu = False
    torch.save(c, p)' "$BATS_FILE_TMPDIR/gelu/iter_0000100" \
		"$BATS_FILE_TMPDIR/gelu-moe/iter_0000100"
}

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# ranks SRC TP MODE ORACLE: mount SRC at tp=TP with the preset, check each
# rank's linear_fc1 against ORACLE (check_swiglu_ranks.py MODE).
ranks() {
	mount_ff "$1" "$MNT" "tp=$2,rules=@megatron-gpt"
	run env PYTHONPATH="$STUB" /usr/bin/python3 "$CHECK" "$MNT" "$2" "$3" "$4"
	echo "$output"
	unmount_ff "$MNT"
}

# fc1 FIXTURE SRC TP MODE [PATTERN]: SRC (FIXTURE's tensors, its args' swiglu
# as SRC has it) at tp=TP gives each rank's linear_fc1 as MODE's oracle
# does (megatron: Megatron's own per-rank files of FIXTURE; chunk:
# torch.chunk's rows of FIXTURE's truth), the checker saying PATTERN (a
# glob; "ok: *"), and not as the other mode's.
fc1() {
	local fx=$1 src=$2 tp=$3 mode=$4 want=${5:-"ok: *"} other=megatron
	local -A oracle=(
		[megatron]=$BATS_FILE_TMPDIR/exp-$fx-$tp-1-local/iter_0000100
		[chunk]=$FLEXFS_SRC/tests/fixtures/$fx/truth/model)
	[[ $mode == chunk ]] || other=chunk
	ranks "$src" "$tp" "$mode" "${oracle[$mode]}"
	# shellcheck disable=SC2053 # a glob on purpose
	[[ $status -eq 0 && $output == $want ]]
	ranks "$src" "$tp" "$other" "${oracle[$other]}"
	[[ $status -ne 0 ]]
}

@test "preset megatron-gpt: a SwiGLU fc1 is [gate_r; up_r] on each TP rank, as Megatron's own per-rank files (tp 2, 4)" {
	require_fuse
	local tp
	for tp in 2 4; do
		# not torch.chunk's rows of [gate; up]
		fc1 megatron-untied "$MEG" $tp megatron
	done
	# index.json gives each rank's parts as boxes of the global tensor
	run "$FLEXFS_INSPECT" "$MEG" -o "tp=2,rules=@megatron-gpt" --json
	python3 -c '
import json, sys
t = json.load(sys.stdin)["tensors"]["decoder.layers.mlp.linear_fc1.weight"]
assert t["split_axis"] == 1 and t["split_groups"] == 2
r = t["placement"]["tp01_pp00"]
assert r["shape"] == [4, 32, 16] and "offset" not in r
assert r["parts"] == [{"offset": [0, 16, 0], "shape": [4, 16, 16]},
                      {"offset": [0, 48, 0], "shape": [4, 16, 16]}]' <<<"$output"
	# hf/ keeps the whole tensor: the same bytes as with no rules
	mount_ff "$MEG" "$MNT" "tp=2,rules=@megatron-gpt"
	cp "$MNT/hf/model.safetensors" "$BATS_TEST_TMPDIR/a"
	# the rank file's metadata: the first part's global offset
	python3 -c '
import json, struct, sys
f = open(sys.argv[1], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
m = json.loads(h["__metadata__"]["flexfs"])["tensors"]
m = m["decoder.layers.mlp.linear_fc1.weight"]
assert m["global_offset"] == [0, 16, 0] and m["split_groups"] == 2, m' \
		"$MNT/ranks/tp01_pp00/model.safetensors"
	unmount_ff "$MNT"
	mount_ff "$MEG" "$MNT" "tp=2"
	cmp "$BATS_TEST_TMPDIR/a" "$MNT/hf/model.safetensors"
	unmount_ff "$MNT"
}

@test "preset megatron-gpt: a GELU fc1 (args.swiglu False) is a plain row split (tp 2, 4)" {
	require_fuse
	local tp
	for tp in 2 4; do
		fc1 megatron-untied "$BATS_FILE_TMPDIR/gelu/iter_0000100" $tp chunk
	done
}

@test "preset megatron-gpt: a SwiGLU MoE's expert fc1 is [gate_r; up_r] on each TP rank, as Megatron's per-rank files (tp 2, 4)" {
	require_fuse
	local tp
	for tp in 2 4; do
		# 2 layers x 4 experts per rank, all of them the experts'
		fc1 megatron-moe "$MOE" $tp megatron \
			"ok: $((8 * tp)) per-rank layer tensors ($((8 * tp)) of experts)"
		# GELU: the plain row split, not Megatron's SwiGLU rows
		fc1 megatron-moe "$BATS_FILE_TMPDIR/gelu-moe/iter_0000100" $tp chunk
	done
}

@test "preset megatron-gpt: a non-homogeneous MoE's per-layer expert fc1 is [gate_r; up_r] on each TP rank (tp 2, 4)" {
	require_fuse
	local tp
	for tp in 2 4; do
		# layer 0 dense, layer 1 of 4 experts (decoder.layers.1.mlp.
		# experts.experts.*: [expert, rows, in])
		fc1 megatron-moe-mixed \
			"$FLEXFS_SRC/tests/fixtures/megatron-moe-mixed/ckpt/iter_0000100" \
			$tp megatron "ok: $((5 * tp)) per-rank layer tensors ($((4 * tp)) of experts)"
	done
}

@test "preset megatron-gpt: a SwiGLU fc1's bias is [gate_r; up_r] too (tp 2, 4)" {
	require_fuse
	local tp
	for tp in 2 4; do
		# 2 layers' weight and bias per rank
		fc1 megatron-gpt-bias \
			"$FLEXFS_SRC/tests/fixtures/megatron-gpt-bias/ckpt/iter_0000100" \
			$tp megatron "ok: $((4 * tp)) per-rank layer tensors (0 of experts)"
	done
}

@test "rules: groups needs a split axis and divisible parts; when names a known fact" {
	local r=$BATS_TEST_TMPDIR/r.json
	echo '[{"match": "*", "groups": 2}]' >"$r"
	run "$FLEXFS_INSPECT" "$MEG" -o "tp=2,rules=$r"
	[[ $status -ne 0 && $output == *"rule 0: groups: needs a split axis"* ]]
	echo '[{"match": "*", "split": 0, "when": "gelu"}]' >"$r"
	run "$FLEXFS_INSPECT" "$MEG" -o "tp=2,rules=$r"
	[[ $status -ne 0 && $output == *"rule 0: when: expected a model fact"* ]]
	echo '[{"match": "decoder.layers.mlp.linear_fc1.weight", "split": 1, "groups": 3}]' >"$r"
	run "$FLEXFS_INSPECT" "$MEG" -o "tp=2,rules=$r"
	echo "$output"
	[[ $status -ne 0 && $output == *"decoder.layers.mlp.linear_fc1.weight"*"do not divide into 6"* ]]
}
