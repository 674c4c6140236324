# SPDX-License-Identifier: MIT
# Allocation-failure test over the whole mount path (tests/unit/test_chaos.c):
# the N-th allocation fails, for every N; exits 77 (skipped) under ASan.
flx_unit(test_chaos flx_fs)
# -rdynamic: names in the backtraces it prints (and malloc stays exported).
target_link_options(test_chaos PRIVATE -rdynamic)
set_tests_properties(test_chaos PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
