# SPDX-License-Identifier: MIT
# Allocation-failure test over the whole mount path (tests/unit/test_chaos.c):
# the N-th allocation fails, for every N; exits 77 (skipped) under ASan.
flx_unit(test_chaos flx_fs)
# -rdynamic: names in the backtraces it prints (and malloc stays exported).
target_link_options(test_chaos PRIVATE -rdynamic)
set_tests_properties(test_chaos PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over the Hugging Face safetensors source (sharded, with its rules).
add_test(NAME test_chaos_hf COMMAND test_chaos fixtures/hf-tiny/sharded
  fixtures/hf-tiny/rules.json WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_hf PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over the Megatron-Core torch_dist source (MoE; its stacked
# layers at pp=2 need the rule that gives their stage).
add_test(NAME test_chaos_megatron COMMAND test_chaos
  fixtures/megatron-moe/ckpt/iter_0000100 unit/data/megatron/chaos-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_megatron PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over the Paddle Flex Checkpoint source (sharding stage 1 v2:
# flattened shards, replicas; every .distcp decoded at open).
add_test(NAME test_chaos_paddle COMMAND test_chaos
  fixtures/paddle-flex-np2-sharding/ckpt unit/data/paddle/chaos-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_paddle PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over Paddle arrays saved in pieces (protocol 3, UnpackBigParamInfor@@).
add_test(NAME test_chaos_paddle_pieces COMMAND test_chaos
  fixtures/paddle-flex-pieces/ckpt unit/data/paddle/chaos-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_paddle_pieces PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over the Megatron-Core zarr backend (a directory of arrays and
# object files per key, listed and opened at mount).
add_test(NAME test_chaos_megatron_zarr COMMAND test_chaos
  fixtures/megatron-zarr/ckpt unit/data/megatron/chaos-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_megatron_zarr PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over the torch.save source: a training checkpoint (zip, nested
# state dict, optimizer tensors), transformers' sharded .bin + index, and
# a legacy (pre-1.6) file.
add_test(NAME test_chaos_torchsave COMMAND test_chaos
  fixtures/ts-t113-train/ckpt fixtures/ts-t113-train/rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_torchsave PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
add_test(NAME test_chaos_torchsave_sharded COMMAND test_chaos
  fixtures/ts-t113-sharded/ckpt fixtures/ts-t113-sharded/rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_torchsave_sharded PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
add_test(NAME test_chaos_torchsave_legacy COMMAND test_chaos
  fixtures/ts-t113-legacy/ckpt fixtures/ts-t113-legacy/rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_torchsave_legacy PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over the megatron-legacy source (per-rank torch.save files:
# rank directories listed, replicated tensors compared at open).
add_test(NAME test_chaos_megatron_legacy COMMAND test_chaos
  fixtures/megatron-legacy-tp2pp2/ckpt/iter_0000100 unit/data/megatron/chaos-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_megatron_legacy PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over an expert-parallel legacy save (mp_rank_TT_EEE: experts
# merged across expert ranks, everything else compared between them).
add_test(NAME test_chaos_megatron_legacy_ep COMMAND test_chaos
  fixtures/megatron-legacy-moe-ep2/ckpt/iter_0000100 unit/data/megatron/chaos-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_megatron_legacy_ep PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# The same over the DeepSpeed ZeRO source (stage 3, through the save
# directory's `latest`: per-rank model and optimizer states).
add_test(NAME test_chaos_deepspeed COMMAND test_chaos
  fixtures/deepspeed/zero3-bf16-dp2/ckpt unit/data/deepspeed/chaos-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_deepspeed PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
# Tensor-parallel ZeRO: two model-parallel ranks merged, the replicated
# tensors compared at open.
add_test(NAME test_chaos_deepspeed_tp COMMAND test_chaos
  fixtures/deepspeed/zero2-fp16-tp2-dp2/ckpt unit/data/deepspeed/chaos-tp-rules.json
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(test_chaos_deepspeed_tp PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
