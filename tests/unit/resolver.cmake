# SPDX-License-Identifier: MIT
# Resolver parser tests (pickle VM, torch.save ZIP locator, tensor data.pkl).
# Vectors and their generator live in unit/data/ (gen_vectors.py).
flx_unit(test_pickle flx_resolver)
flx_unit(test_zipitem flx_resolver)
flx_unit(test_torchpkl flx_resolver)
flx_unit(test_reader flx_resolver)
