# SPDX-License-Identifier: MIT
flx_unit(test_view flx_fs)
# Generated files (index.json, safetensors headers, .npy) against jansson.
flx_unit(test_formats flx_fs)
