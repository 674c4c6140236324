# SPDX-License-Identifier: MIT
# AOA statements: the parser (every example of paddle-format.md section 5,
# malformed statements) and the compiler over hf-tiny.
flx_unit(test_aoa flx_reshard)
