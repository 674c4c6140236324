# SPDX-License-Identifier: MIT
# zstd items (issue #21): the window cache of the read path against the
# content it compresses, many threads included.
flx_unit(test_zcache flx_resolver)
# zstd items at mount: descriptors, frame headers, the bounded decode, the
# storage record's CRC-32 taken on the way.
flx_unit(test_zstditem flx_resolver)
