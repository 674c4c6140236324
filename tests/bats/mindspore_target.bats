#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The mindspore/ tree: rank_N/checkpoint_N.ckpt, MindSpore .ckpt files of
# the target ranks.  lib/check_mindspore.py parses every served file with
# python3-protobuf and the spec's schema as load_checkpoint does (records
# joined by tag, tensor_type to numpy, dims) and compares each tensor with
# the truth sliced by an independent implementation of the target layout
# (check_views.expected_plan for tp/pp, the spec's 2.7 boxes of
# tools/fixtures/gen_mindspore.py for dst_strategy).

load helpers

FX=$FLEXFS_SRC/tests/fixtures
CHECK=$FLEXFS_SRC/tests/bats/lib/check_mindspore.py

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check_plan DIR TRUTH TP PP [OPTS]: mount DIR with mindspore at tp/pp,
# check every rank file, unmount cleanly; the daemon said nothing but the
# note about FSDP's data-parallel shards.
check_plan() {
	local dir=$1 truth=$2 tp=$3 pp=$4 opts=${5:-} rules=
	[[ $opts == *rules=* ]] && rules=${opts#*rules=} && rules=${rules%%,*}
	mount_ff "$dir" "$MNT" "tp=$tp,pp=$pp,mindspore${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" plan "$MNT" "$truth" "$tp" "$pp" $rules
	echo "$dir tp=$tp pp=$pp $opts: $output"
	[ "$status" -eq 0 ]
	[[ $output == "$((tp * pp)) files equal" ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	! grep -v "data-parallel shards along dim 0 (FSDP)" "$FF_ERR"
}

@test "mindspore/ of dcp-t113 at tp 1,2,4 x pp 1,2: every rank's .ckpt as load_checkpoint reads it" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_plan "$FX/dcp-t113/ckpt" "$FX/dcp-t113/truth" "$tp" "$pp" \
				"rules=$RULES"
		done
	done
}

@test "mindspore/ of FSDP2 x TP and FSDP2 checkpoints at tp 2" {
	check_plan "$FX/fsdp2-tp/ckpt" "$FX/fsdp2-tp/truth" 2 1
	check_plan "$FX/fsdp2/ckpt" "$FX/fsdp2/truth" 2 2
}

@test "mindspore/ only when asked for: a DCP mount's root is unchanged without it" {
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	[ ! -e "$MNT/mindspore" ]
	unmount_ff "$MNT"
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES,mindspore=0"
	[ ! -e "$MNT/mindspore" ]
	unmount_ff "$MNT"
}

@test "mindspore/: a dtype load_checkpoint cannot read is left out of the .ckpt, the rest served; index.json keeps it" {
	mount_ff "$FX/dcp-zstd-mini/ckpt" "$MNT" "mindspore"
	f=$MNT/mindspore/rank_0/checkpoint_0.ckpt
	[ -s "$f" ]
	! grep -q "fp8.weight" "$f"
	! grep -q "Float8" "$f"
	grep -q "norm.weight" "$f"
	grep -q '"fp8.weight"' "$MNT/index.json"
	[ -s "$MNT/ranks/tp00_pp00/tensors/fp8.weight.npy" ]
	unmount_ff "$MNT"
}

# check_strategy STRATEGY [ORACLE]: mount the MindSpore truth as a Hugging
# Face source with dst_strategy=STRATEGY, check every rank's file against
# the truth sliced by the spec's 2.7 boxes (gen_mindspore.spec_box) of
# ORACLE (default STRATEGY; the protobuf twin of a JSON file whose
# Layout-API maps are stored expanded).
check_strategy() {
	local strat=$1 oracle=${2:-$1} src=$BATS_TEST_TMPDIR/hf
	[ -d "$src" ] || /usr/bin/python3 "$CHECK" hf "$FX/mindspore-truth" "$src"
	mount_ff "$src" "$MNT" "dst_strategy=$strat"
	run /usr/bin/python3 "$CHECK" strategy "$MNT" "$FX/mindspore-truth" "$oracle"
	echo "$strat: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" files equal" ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

@test "mindspore/ from dst_strategy: TP4 x DP2 with optimizer shard, protobuf and JSON" {
	check_strategy "$FX/mindspore-tp2dp2/target-tp4dp2/strategy/ckpt_strategy_rank_0.ckpt"
	check_strategy "$FX/mindspore-tp2dp2/strategy/ckpt_strategy_rank_0.ckpt"
	check_strategy "$FX/mindspore-tp2dp2/strategy_json/ckpt_strategy_rank_0.json"
}

@test "mindspore/ from dst_strategy: a merged pipeline strategy (2 stages, Layout-API maps), DP4 with groups of 2" {
	check_strategy "$FX/mindspore-pp2/merged/merged_ckpt_strategy.ckpt"
	check_strategy "$FX/mindspore-pp2/target-dp4/strategy/ckpt_strategy_rank_0.ckpt"
	check_strategy "$FX/mindspore-flat-mf/strategy/ckpt_strategy_rank_0.ckpt"
}

@test "mindspore/ from dst_strategy: a merged JSON strategy with expanded Layout-API maps is folded as the protobuf twin" {
	# JSON writes Layout-API maps expanded (docs/formats/mindspore.md#strategy-json): lm_head.weight has 3
	check_strategy "$FX/mindspore-pp2/merged/merged_ckpt_strategy.json" \
		"$FX/mindspore-pp2/merged/merged_ckpt_strategy.ckpt"
}

@test "mindspore/ from dst_strategy: refused in one line: a layout that does not fit its tensor, a missing file" {
	local src=$BATS_TEST_TMPDIR/hf
	/usr/bin/python3 "$CHECK" hf "$FX/mindspore-truth" "$src"
	# an expanded map whose leading dim is not a split of size 1 (the
	# merged JSON with lm_head's map [1,0,-1] made [-1,0,-1]) cannot fold
	/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
d["parallel_layout_item"]["1-lm_head.weight"]["tensor_map"] = [-1, 0, -1]
json.dump(d, open(sys.argv[2], "w"))' "$FX/mindspore-pp2/merged/merged_ckpt_strategy.json" "$BATS_TEST_TMPDIR/bad.json"
	mount_refused_line "$src" "dst_strategy=$BATS_TEST_TMPDIR/bad.json" \
		"*bad.json: lm_head.weight: tensor map of 3 dims for a tensor of 2 (an expanded Layout-API map that does not fold back)*"
	mount_refused_line "$src" "dst_strategy=$BATS_TEST_TMPDIR/none.ckpt" \
		"*none.ckpt: dst_strategy: cannot open the strategy file: No such file or directory*"
}

# check_same FIXTURE SRC_STRATEGY TARGET: mount the MindSpore fixture with
# its source strategy and the target's strategy; every rank file holds
# what transform_checkpoints writes (gen_mindspore.py transform: the
# fixture's TARGET/ckpt), weights, optimizer moments and scalars.
check_same() {
	local fx=$FX/$1 src=$2 tgt=$FX/$1/$3
	mount_ff "$fx/ckpt" "$MNT" "src_strategy=$fx/$src,dst_strategy=$tgt/strategy/ckpt_strategy_rank_0.ckpt"
	run /usr/bin/python3 "$CHECK" same "$MNT" "$tgt/ckpt"
	echo "$1 -> $3: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" files equal" ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "mindspore/ round trip: a MindSpore checkpoint resharded to another strategy holds what transform_checkpoints writes" {
	check_same mindspore-tp2dp2 strategy/ckpt_strategy_rank_0.ckpt target-tp4dp2
	check_same mindspore-pp2 merged/merged_ckpt_strategy.ckpt target-dp4
}
