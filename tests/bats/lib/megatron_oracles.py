#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write several gen_megatron.py legacy oracles in one process (torch imported once).

usage: megatron_oracles.py GEN_MEGATRON_PY FIXTURES OUT FIXTURE:TP:PP:SPEC[:V][:epE][:vpN]...
each into OUT/exp-FIXTURE-TP-PP-SPEC[-V][-epE][-vpN] (what `gen_megatron.py legacy` writes;
V: its --true-vocab, E its --ep, N its --vp).
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
        fx, tp, pp, sp, *more = t.split(":")
        v = [x for x in more if x.isdigit()]
        par = {x[:2]: int(x[2:]) for x in more if x[:2] in ("ep", "vp")}
        g.write_legacy(os.path.join(fixtures, fx), int(tp), int(pp),
                       os.path.join(out, "exp-" + "-".join([fx, tp, pp, sp] + more)), sp,
                       int(v[0]) if v else None, par.get("ep", 1), par.get("vp", 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
