# SPDX-License-Identifier: MIT
# flexfs-materialize's decisions: rank of each file, resume rule, views.
flx_unit(test_materialize flx_materialize)
