#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# fused_qkv over a Megatron source takes its heads and key-value groups from
# the args (docs/facts.md).  args.group_query_attention absent: the groups
# are what linear_qkv's rows show ((heads + 2 groups) x kv_channels against
# 3 heads x kv_channels), never MHA assumed; when nothing shows them the
# preset is refused naming -o aoa_num_key_value_groups=, which states them.
# Oracle: lib/aoa_megatron_check.py, the HF Llama names and layouts of
# tests/fixtures/megatron-untied's truth (8 heads, 4 groups).

load helpers
load megatron_helpers

MEG=$FLEXFS_SRC/tests/fixtures/megatron-untied/ckpt/iter_0000100
MEG_TRUTH=$FLEXFS_SRC/tests/fixtures/megatron-untied/truth

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

llama_ok() {
	run /usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/aoa_megatron_check.py" "$MNT" "$MEG_TRUTH"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"checked 39 tensors (4 layers, 8 heads, 4 groups), 0 wrong"* ]]
}

@test "aoa over megatron: group_query_attention absent: groups from linear_qkv's rows; with kv_channels absent too: refused naming aoa_num_key_value_groups, which states them" {
	local d=$BATS_TEST_TMPDIR/nogqa e=$BATS_TEST_TMPDIR/nokv
	copy_common "$MEG" "$d" 'del c["args"].group_query_attention'
	mount_ff "$d" "$MNT" "rules=@megatron-gpt-to-hf-llama"
	llama_ok
	unmount_ff "$MNT"
	copy_common "$MEG" "$e" 'del c["args"].group_query_attention; del c["args"].kv_channels'
	mount_refused_line "$e" "rules=@megatron-gpt-to-hf-llama" \
		"*fused_qkv needs num_heads and num_key_value_groups*aoa_num_key_value_groups=*"
	mount_ff "$e" "$MNT" "rules=@megatron-gpt-to-hf-llama,aoa_num_key_value_groups=4"
	llama_ok
	unmount_ff "$MNT"
}
