#!/usr/bin/env python3
"""Build a check_views.py truth dir for a tests/fixtures/paddle-* fixture.

The fixture's truth (tools/fixtures/gen_paddle.py) holds every full tensor
of each checkpoint id as truth/id<N>/<key>.npy (bf16 as <u2 bits, float8 as
|u1 bits) and, in truth/manifest.json, each tensor's Paddle dtype and its
shards (file, global_offset, local_shape, flattened range, replica_id).
The saved chunks that check_views.py infers the split axis from are the
shards' tensor-parallel blocks (global_offset, local_shape; replica copies
and the flattened pieces of one block count once), which is what a Paddle
loader reshards from.  Nothing of flexfs is used.

  OUT/manifest.json   {"tensors": {key: {dtype, shape, file, itemsize,
                       nbytes, sha256, chunks, stacked: 0}}, "objects": {}}
  OUT/<n>.bin         raw little-endian bytes, C order

Usage: paddle_truth.py FIXTURE_DIR OUT_DIR [--id N] [--part NAME]...
(default: the fixture's default id; --part: a PaddleFormers sub-directory,
model_state or optimizer_state; several: the tensors of all, as a mount of
checkpoint-N/ serves them).  /usr/bin/python3 (numpy).
"""

import argparse
import hashlib
import json
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture")
    ap.add_argument("out")
    ap.add_argument("--id", type=int)
    ap.add_argument("--part", action="append",
                    help="a PaddleFormers part; several: their tensors together")
    a = ap.parse_args()
    with open(os.path.join(a.fixture, "truth", "manifest.json")) as f:
        man = json.load(f)
    uid = man["default_id"] if a.id is None else a.id
    parts = a.part or [None]
    cks = [c for p in parts for c in man["checkpoints"]
           if c["unique_id"] == uid and c.get("part") == p]
    assert len(cks) == len(parts), (uid, parts)
    os.makedirs(a.out, exist_ok=True)
    tensors = {}
    items = [(ck, key, e) for ck in cks for key, e in ck["tensors"].items()]
    for i, (ck, key, e) in enumerate(items):
        assert key not in tensors, key
        arr = np.load(os.path.join(a.fixture, ck["truth"], e["npy"]))
        assert list(arr.shape) == list(e["shape"]), key
        b = np.ascontiguousarray(arr).tobytes()
        fn = "%04d.bin" % i
        with open(os.path.join(a.out, fn), "wb") as f:
            f.write(b)
        blocks = []
        for s in e["shards"]:
            if s.get("replica_id") not in (None, 0):
                continue
            blk = {"offsets": list(s["global_offset"]), "sizes": list(s["local_shape"])}
            if blk not in blocks:
                blocks.append(blk)
        tensors[key] = {
            "dtype": e["paddle_dtype"], "shape": list(e["shape"]), "file": fn,
            "itemsize": arr.dtype.itemsize, "nbytes": len(b),
            "sha256": hashlib.sha256(b).hexdigest(), "chunks": blocks, "stacked": 0,
        }
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump({"tensors": tensors, "objects": {}}, f, indent=1)
    print("paddle_truth: id %d, %d tensors" % (uid, len(tensors)))


if __name__ == "__main__":
    main()
