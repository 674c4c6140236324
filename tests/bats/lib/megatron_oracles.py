#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write several gen_megatron.py legacy oracles in one process (torch imported once).

usage: megatron_oracles.py GEN_MEGATRON_PY FIXTURES OUT FIXTURE:TP:PP:SPEC[:V]...
each into OUT/exp-FIXTURE-TP-PP-SPEC[-V] (what `gen_megatron.py legacy` writes; V: its
--true-vocab).
"""
import importlib.util
import os
import sys


def main():
    gen, fixtures, out = sys.argv[1:4]
    spec = importlib.util.spec_from_file_location("gen_megatron", gen)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    for t in sys.argv[4:]:
        fx, tp, pp, sp, *v = t.split(":")
        g.write_legacy(os.path.join(fixtures, fx), int(tp), int(pp),
                       os.path.join(out, "exp-" + "-".join([fx, tp, pp, sp] + v)), sp,
                       int(v[0]) if v else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
