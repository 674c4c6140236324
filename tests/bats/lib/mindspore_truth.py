#!/usr/bin/env python3
"""Build a check_views.py truth dir for a tests/fixtures/mindspore-* checkpoint.

Every tensor a mount of CKPT_DIR serves (the entries of its rank files,
decoded by tools/fixtures/gen_mindspore.py's own readers, less `str` values
and zero-element tensors, which have no record) with its full value from
gen_mindspore.py's truth (the values the stand-in writer sliced), and as
saved chunks the distinct model-parallel boxes of its layout in STRATEGY
(docs/formats/mindspore.md#box-algorithm without the optimizer shard, which is no tensor-parallel split),
computed by gen_mindspore.py's spec_box.  Nothing of flexfs is used.

  OUT/manifest.json   {"tensors": {name: {dtype, shape, file, itemsize,
                       nbytes, sha256, chunks, stacked: 0}}, "objects": {}}
  OUT/<n>.bin         raw little-endian bytes, C order

Usage: mindspore_truth.py CKPT_DIR STRATEGY OUT   (/usr/bin/python3: numpy,
python3-protobuf)
"""

import copy
import hashlib
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools", "fixtures"))
import gen_mindspore as G  # noqa: E402

TORCH = {"Bool": "bool", "Int8": "int8", "UInt8": "uint8", "Int16": "int16",
         "UInt16": "uint16", "Int32": "int32", "UInt32": "uint32", "Int64": "int64",
         "UInt64": "uint64", "Float16": "float16", "Float32": "float32",
         "Float64": "float64", "BFloat16": "bfloat16"}


def rank_files(src):
    out = {}
    for d in sorted(os.listdir(src)):
        p = os.path.join(src, d)
        m = re.fullmatch(r"rank_(\d+)", d)
        if m and os.path.isdir(p):
            fs = sorted(f for f in os.listdir(p) if f.endswith(".ckpt"))
            fs = fs or sorted(f for f in os.listdir(p) if f.endswith(".safetensors"))
            if fs:
                out[int(m.group(1))] = os.path.join(p, fs[-1])
        m = re.search(r"rank_(\d+)", d)
        if m and d.endswith((".ckpt", ".safetensors")) and os.path.isfile(p):
            out[int(m.group(1))] = p
    return out


def main():
    src, strat, out = sys.argv[1:4]
    tr = G.truth()
    strategy = G.read_strategy(strat)
    N = G.stage_device_count(strategy)
    order, held = [], {}
    for r, path in sorted(rank_files(src).items()):
        ents, _ = G.load_rank_file(path)
        for name, e in ents.items():
            if e["type"] == "str":
                continue
            if name not in held:
                order.append(name)
                held[name] = []
            held[name].append(r)
    os.makedirs(out, exist_ok=True)
    tensors = {}
    for i, name in enumerate(order):
        t = tr[name]
        v = t["value"]
        b = G.raw_bytes(v)
        shape = list(t["shape"])
        blocks = []
        for r in held[name]:
            L = G.layout_for(strategy, name, r // N)
            if L is None:
                blk = {"offsets": [0] * len(shape), "sizes": shape}
            else:
                mp = copy.copy(L)
                mp.step = mp.size = 0
                st, ln = G.spec_box(mp, shape, r % N)
                blk = {"offsets": list(st), "sizes": list(ln)}
            if blk not in blocks:
                blocks.append(blk)
        fn = "%04d.bin" % i
        with open(os.path.join(out, fn), "wb") as f:
            f.write(b)
        tensors[name] = {"dtype": TORCH[t["type"]], "shape": shape, "file": fn,
                         "itemsize": len(b) // max(1, int(G.prod(shape))),
                         "nbytes": len(b), "sha256": hashlib.sha256(b).hexdigest(),
                         "chunks": blocks, "stacked": 0}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"tensors": tensors, "objects": {}}, f, indent=1)
    print("mindspore_truth: %d tensors" % len(tensors))


if __name__ == "__main__":
    main()
