# SPDX-License-Identifier: MIT
# Mount-option layer: pure string logic, no FUSE needed.
flx_unit(test_mountopts flx_mountopts)
flx_unit(test_optdoc flx_mountopts)
