# SPDX-License-Identifier: MIT
# Resolver tests: the parsers (pickle VM, torch.save ZIP locator, tensor
# data.pkl), the small-read cache, the index builder and its sources.
# Vectors and their generator live in unit/data/ (gen_vectors.py).
flx_unit(test_pickle flx_resolver)
flx_unit(test_zipitem flx_resolver)
flx_unit(test_torchpkl flx_resolver)
flx_unit(test_torchfile flx_resolver)
flx_unit(test_reader flx_resolver)
flx_unit(test_index flx_resolver)
flx_unit(test_opt flx_resolver)
flx_unit(test_flatbox flx_resolver)
flx_unit(test_megatron flx_reshard)
flx_unit(test_paddle flx_reshard)
flx_unit(test_mindspore_strategy flx_resolver)
flx_unit(test_mindspore flx_resolver)
# A real torch 2.6 dcp.save of the dtypes and view forms the other fixtures
# lack (tools/fixtures/gen_dcp_dtypes.py): every tensor's digest equals
# torch's own load (docs/spec-audit-dcp.md).
add_test(NAME dcp_t26_dtypes
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/unit/check_dcp_digest.sh
    $<TARGET_FILE:flexfs-inspect>
    ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/dcp-t26-dtypes)
