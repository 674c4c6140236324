# SPDX-License-Identifier: MIT
flx_unit(test_view flx_fs)
