#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Compare a mount's megatron/ legacy tree with the files gen_megatron.py legacy wrote.

usage: check_megatron_legacy.py --mount MNT/megatron --expected DIR [--mount .. --expected ..]
                                --stub STUBDIR [--weights-only] [--mmap]

DIR is `gen_megatron.py legacy --out DIR` (the oracle: numpy slices of the truth, saved by
torch.save).  Every file of DIR's expected.json is torch.load-ed from both trees and compared:
the top-level keys and their order, checkpoint_version and iteration (values and types), every
args attribute (vars() equal, in order), and every model key in order: None against None,
tensors by dtype, shape and bits.  The mount must hold no other rank directory, and its
latest_checkpointed_iteration.txt must equal the oracle's.  --weights-only loads the mount's
files as Megatron does on torch >= 2.4 (argparse.Namespace and the args' enum added to the
safe globals); --mmap maps them (torch >= 2.1).
"""
import argparse
import json
import os
import sys


def bits(torch, t):
    t = t.contiguous()
    if t.numel() == 0:
        return []
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view).reshape(-1).tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, action="append")
    ap.add_argument("--expected", required=True, action="append")
    ap.add_argument("--stub", required=True)
    ap.add_argument("--weights-only", action="store_true")
    ap.add_argument("--mmap", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, a.stub)
    import torch
    from megatron.core.transformer.enums import AttnBackend

    kw = {"weights_only": False}
    if a.weights_only:
        torch.serialization.add_safe_globals([argparse.Namespace, AttnBackend])
        kw["weights_only"] = True
    if a.mmap:
        kw["mmap"] = True
    fails, keys, nfiles = [], 0, 0
    for mount, expected in zip(a.mount, a.expected):
        k, n = check_tree(torch, mount, expected, kw, fails)
        keys += k
        nfiles += n
    for f in fails[:20]:
        print("FAIL", f)
    print("%d files, %d model keys: %d passed, %d failed" % (
        nfiles, keys, 0 if fails else nfiles, len(fails)))
    return 1 if fails else 0


def check_model(torch, rel, mk, gm, em, bad):
    """Compare one state dict of a legacy file; the number of keys compared."""
    keys = 0
    if type(gm).__name__ != "OrderedDict":
        bad("%s: %s is a %s" % (rel, mk, type(gm).__name__))
    if list(gm) != list(em):
        bad("%s: %s keys %s != %s" % (rel, mk, list(gm), list(em)))
        return keys
    for k in em:
        keys += 1
        x, y = gm[k], em[k]
        if y is None or x is None:
            if not (x is None and y is None):
                bad("%s: %s is %r, expected %r" % (rel, k, x, y))
            continue
        if x.dtype != y.dtype or tuple(x.shape) != tuple(y.shape):
            bad("%s: %s %s %s != %s %s" % (rel, k, x.dtype, tuple(x.shape), y.dtype,
                                           tuple(y.shape)))
        elif bits(torch, x) != bits(torch, y):
            bad("%s: %s values differ" % (rel, k))
    return keys


def check_tree(torch, mount, expected, kw, fails):
    exp = json.load(open(os.path.join(expected, "expected.json")))
    keys = 0

    def bad(msg):
        fails.append("%s: %s" % (mount, msg))

    want = open(os.path.join(expected, "latest_checkpointed_iteration.txt")).read()
    got = open(os.path.join(mount, "latest_checkpointed_iteration.txt")).read()
    if got != want:
        bad("latest_checkpointed_iteration.txt %r != %r" % (got, want))
    rels = sorted(exp["files"])
    iters = sorted(os.listdir(mount))
    for it in {r.split("/")[0] for r in rels}:
        have = sorted(os.listdir(os.path.join(mount, it)))
        wanted = sorted({r.split("/")[1] for r in rels if r.startswith(it + "/")})
        if have != wanted:
            bad("%s holds %s, expected %s" % (it, have, wanted))
    if iters != sorted({"latest_checkpointed_iteration.txt"} | {r.split("/")[0] for r in rels}):
        bad("megatron/ holds %s" % iters)
    for rel in rels:
        e = torch.load(os.path.join(expected, rel), map_location="cpu", weights_only=False)
        g = torch.load(os.path.join(mount, rel), map_location="cpu", **kw)
        if list(g) != list(e):
            bad("%s: top-level keys %s != %s" % (rel, list(g), list(e)))
            continue
        for k in ("checkpoint_version", "iteration"):
            if type(g[k]) is not type(e[k]) or g[k] != e[k]:
                bad("%s: %s %r != %r" % (rel, k, g[k], e[k]))
        ga, ea = vars(g["args"]), vars(e["args"])
        if list(ga.items()) != list(ea.items()):
            diff = [k for k in set(ga) | set(ea) if ga.get(k, "<absent>") != ea.get(k, "<absent>")]
            bad("%s: args differ in %s (order equal: %s)" % (
                rel, sorted(diff), list(ga) == list(ea)))
        # "model", or with a virtual pipeline "model0", "model1", ...
        for mk in [k for k in e if k == "model" or k[5:].isdigit() and k[:5] == "model"]:
            keys += check_model(torch, rel, mk, g[mk], e[mk], bad)
    return keys, len(rels)


if __name__ == "__main__":
    sys.exit(main())
