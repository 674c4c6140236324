#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The MindSpore source: the tests/fixtures/mindspore-* checkpoints
# (tools/fixtures/gen_mindspore.py, a stand-in writer to the spec) mounted
# with their strategy file (-o src_strategy=, protobuf and JSON, merged
# pipeline strategies), each at tp 1, 2 x pp 1, 2, and every byte of every
# generic view (index.json, ranks/*/model.safetensors, npy, hf/) checked by
# lib/check_views.py against the truth lib/mindspore_truth.py builds from
# the generator's own values and layout arithmetic (nothing of flexfs).
# Layouts: TP2 x DP2 with the parallel optimizer on every parameter and
# Values cut every 200 bytes; MindFormers' front-end strategy with ZeRO-3
# in flat per-rank files; DP2 x MP2 x PP2 through the merged strategy; the
# <= 2.2 writer (BFloat16 as float32, scalar dims [0]); CRC trailers;
# safetensors (>= 2.4), also with remove_redundancy; zero-element tensors
# written by the <= 2.2 writer (an empty record) and by >= 2.3 (none).

load helpers

FX=$FLEXFS_SRC/tests/fixtures
TRUTH=$FLEXFS_SRC/tests/bats/lib/mindspore_truth.py

setup() {
	setup_ff
	views_setup
}

teardown() {
	views_teardown
	teardown_ff
}

# ms_mount DIR STRATEGY TPxPP...: mount DIR with STRATEGY once per TPxPP,
# each to be checked by views_check against the truth of DIR (whose chunks
# come from $MS_TRUTH_STRATEGY when set, else STRATEGY).
ms_mount() {
	local dir=$1 strat=$2
	local truth=$BATS_TEST_TMPDIR/truth-${#VIEWS_MNTS[@]}

	shift 2
	/usr/bin/python3 "$TRUTH" "$dir" "${MS_TRUTH_STRATEGY:-$strat}" \
		"$truth" >/dev/null
	views_add "$dir" "$truth" "src_strategy=$strat" "$@"
}

@test "mindspore tp2dp2 (optimizer shard, 200-byte Values) with protobuf and JSON strategies, and pp2 (dp x mp x pp) with the merged strategy: every view equals the truth" {
	local t=$FX/mindspore-tp2dp2 p=$FX/mindspore-pp2

	ms_mount "$t/ckpt" "$t/strategy/ckpt_strategy_rank_0.ckpt" 1x1 2x1 2x2
	ms_mount "$t/ckpt" "$t/strategy_json/ckpt_strategy_rank_0.json" 2x1
	ms_mount "$p/ckpt" "$p/merged/merged_ckpt_strategy.ckpt" 1x1 2x2 1x2
	# JSON: its Layout-API lm_head.weight expanded, folded back at mount
	MS_TRUTH_STRATEGY=$p/merged/merged_ckpt_strategy.ckpt \
		ms_mount "$p/ckpt" "$p/merged/merged_ckpt_strategy.json" 2x2
	views_check
}

@test "mindspore tp2dp2 with a JSON strategy that omits the optimizer shard (>= 2.6, docs/formats/mindspore.md#optimizer-shard): the shard is inferred from the stored dims, every view equals the truth" {
	local t=$FX/mindspore-tp2dp2

	MS_TRUTH_STRATEGY=$t/strategy/ckpt_strategy_rank_0.ckpt \
		ms_mount "$t/ckpt" "$t/strategy_json-noopt/ckpt_strategy_rank_0.json" 2x1 1x1
	views_check
}

@test "mindspore tp2dp2 with a protobuf strategy that omits the optimizer shard (docs/formats/mindspore.md#optimizer-shard, no global shape to tell it): refused in one line, never the first slice served as the whole" {
	local t=$FX/mindspore-tp2dp2

	mount_refused_line "$t/ckpt" \
		"tp=2,src_strategy=$t/strategy-noopt/ckpt_strategy_rank_0.ckpt" \
		'*.ckpt: *: rank * holds the box of rank * with other bytes: not a replica*' \
		'*strategy-noopt/ckpt_strategy_rank_0.ckpt does not record[?] pass the JSON strategy*'
}

@test "mindspore MindFormers ZeRO-3 flat files, <= 2.2 writer, CRC trailers, safetensors (with remove_redundancy): every view equals the truth" {
	local v

	for v in flat-mf legacy22 crc safetensors; do
		ms_mount "$FX/mindspore-$v/ckpt" \
			"$FX/mindspore-$v/strategy/ckpt_strategy_rank_0.ckpt" 2x1
	done
	ms_mount "$FX/mindspore-safetensors/ckpt-dedup" \
		"$FX/mindspore-safetensors/strategy/ckpt_strategy_rank_0.ckpt" 1x2
	views_check
}

@test "mindspore zero-element tensors (docs/formats/mindspore.md#dims): a <= 2.2 empty record is served in every view, indexed as DCP indexes one (a chunk per box), and mindspore/ writes no record for it; >= 2.3 writes none and a layout without a record is left out" {
	local z=$FX/mindspore-zero

	ms_mount "$z/ckpt-legacy22" "$z/strategy/ckpt_strategy_rank_0.ckpt" 1x1 2x1
	ms_mount "$z/ckpt-legacy22" "$z/strategy_json/ckpt_strategy_rank_0.json" 2x1
	ms_mount "$z/ckpt" "$z/strategy/ckpt_strategy_rank_0.ckpt" 2x1
	ms_mount "$z/ckpt" "$z/strategy_json/ckpt_strategy_rank_0.json" 2x1
	run /usr/bin/python3 - "${VIEWS_MNTS[@]}" <<'PY'
import json, sys
# name: (global shape, distinct boxes saved: [0,4] whole on both ranks; [8,0]
# split in rows over TP2)
zero = {"model.freqs_cache": ([0, 4], 1),
        "model.layers.0.attention.prefix.weight": ([8, 0], 2)}
for i, m in enumerate(sys.argv[1:]):
    t = json.load(open(m + "/index.json"))["tensors"]
    for n, (shape, boxes) in zero.items():
        if i < 3:
            assert t[n]["shape"] == shape and t[n]["source_chunks"] == boxes, (m, n, t[n])
        else:
            assert n not in t, (m, n)
    assert len(t) == (23 if i < 3 else 21), (m, len(t))
print("ok")
PY
	echo "$output"
	[ "$status" -eq 0 ]
	run /usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/check_mindspore.py" \
		plan "${VIEWS_MNTS[1]}" "$BATS_TEST_TMPDIR/truth-0" 2 1
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "2 files equal" ]]
	views_check
}

@test "mindspore index.json names the source; refused at mount in one line: encrypted, bad CRC, a stage's strategy alone, no strategy for sharded ranks" {
	local t=$FX/mindspore-tp2dp2 p=$FX/mindspore-pp2

	mount_ff "$t/ckpt" "$MNT" "src_strategy=$t/strategy/ckpt_strategy_rank_0.ckpt"
	run /usr/bin/python3 - "$MNT/index.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["source"]["format"] == "mindspore", d["source"]
assert d["source"]["writer"].startswith("MindSpore (ckpt, 4 ranks"), d["source"]
print("ok")
PY
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"

	mount_refused_line "$FX/mindspore-encrypted/ckpt" \
		"src_strategy=$FX/mindspore-encrypted/strategy/ckpt_strategy_rank_0.ckpt" \
		'*rank_0/llama_rank_0-2_4.ckpt: encrypted checkpoint (AES-GCM)*'
	mount_refused_line "$FX/mindspore-crc/ckpt-badcrc" \
		"src_strategy=$FX/mindspore-crc/strategy/ckpt_strategy_rank_0.ckpt" \
		'*.ckpt: crc_num: CRC-32 of the file is *'
	mount_refused_line "$p/ckpt" \
		"src_strategy=$p/strategy/ckpt_strategy_rank_4.ckpt" \
		'*ckpt_strategy_rank_4.ckpt: stage: pipeline stage 0 has no layouts*'
	mount_refused_line "$t/ckpt" "" \
		'*rank_1/llama_rank_1-2_4.ckpt: src_strategy: a checkpoint of 4 ranks needs its strategy file*'
}
