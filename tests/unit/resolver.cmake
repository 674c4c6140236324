# SPDX-License-Identifier: MIT
# Resolver tests: the parsers (pickle VM, torch.save ZIP locator, tensor
# data.pkl), the small-read cache, the index builder and its sources.
# Vectors and their generator live in unit/data/ (gen_vectors.py).
flx_unit(test_pickle flx_resolver)
flx_unit(test_zipitem flx_resolver)
flx_unit(test_torchpkl flx_resolver)
flx_unit(test_reader flx_resolver)
flx_unit(test_index flx_resolver)
flx_unit(test_flatbox flx_resolver)
flx_unit(test_megatron flx_reshard)
flx_unit(test_paddle flx_reshard)
flx_unit(test_mindspore_strategy flx_resolver)
flx_unit(test_mindspore flx_resolver)
