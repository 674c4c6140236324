# SPDX-License-Identifier: MIT
# AOA statements: the parser (every example of docs/formats/paddle.md#aoa-statements,
# malformed statements) and the compiler over hf-tiny.
flx_unit(test_aoa flx_reshard)
