# SPDX-License-Identifier: MIT
# zstd items (issue #21): the window cache of the read path against the
# content it compresses, many threads included.
flx_unit(test_zcache flx_reshard)
