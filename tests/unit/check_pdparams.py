#!/usr/bin/env python3
"""Check the Paddle pickles test_pdparams wrote into DIR against
DIR/expected.json: each file is loaded with pickle.load (as paddle.load
does, encoding='latin1') and must be exactly the dict paddle.save writes
(docs/formats/paddle.md#paddlenlp-per-rank-files):

  state_dict: {key: ndarray, ..., ["master_weights": {},]
               "StructuredToParameterName@@": {key: name}}, keys in order;
  tuples:     {key: (name, ndarray), ..., "master_weights": {key: (name,
               ndarray)}}, keys in order;

each array of the expected numpy dtype and shape, C-contiguous, its bytes
those expected.  Exits non-zero on the first file that differs."""

import json
import os
import pickle
import sys

import numpy as np

TABLE = "StructuredToParameterName@@"


def fail(msg):
    sys.exit(f"check_pdparams: {msg}")


def check_array(where, a, e):
    if type(a) is not np.ndarray:
        fail(f"{where}: {type(a).__name__}, not an ndarray")
    if a.dtype.str != e["dtype"] or list(a.shape) != e["shape"]:
        fail(f"{where}: {a.dtype.str} {list(a.shape)}, wanted {e['dtype']} {e['shape']}")
    if not a.flags.c_contiguous or a.tobytes().hex() != e["hex"]:
        fail(f"{where}: bytes differ")


def check(path, exp):
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        obj = pickle.load(f, encoding="latin1")
        if f.read():
            fail(f"{path}: bytes after STOP")
    if head != b"\x80\x04":
        fail(f"{path}: not protocol 4")
    if type(obj) is not dict:
        fail(f"{path}: {type(obj).__name__}, not a dict")
    top = [e for e in exp["entries"] if len(e["path"]) == 1]
    mw = [e for e in exp["entries"] if len(e["path"]) == 2]
    keys = [e["path"][0] for e in top]
    if exp["form"] == "state_dict":
        want = keys + (["master_weights"] if exp["master_empty"] else []) + [TABLE]
        if list(obj) != want:
            fail(f"{path}: keys {list(obj)}, wanted {want}")
        if exp["master_empty"] and obj["master_weights"] != {}:
            fail(f"{path}: master_weights not empty")
        table = obj[TABLE]
        if type(table) is not dict or list(table) != keys:
            fail(f"{path}: name table keys {list(table)}, wanted {keys}")
        for e in top:
            k = e["path"][0]
            if table[k] != e["name"]:
                fail(f"{path}: {k} named {table[k]!r}, wanted {e['name']!r}")
            check_array(f"{path}: {k}", obj[k], e)
        return
    want = keys + ["master_weights"]
    if list(obj) != want:
        fail(f"{path}: keys {list(obj)}, wanted {want}")
    if type(obj["master_weights"]) is not dict or \
            list(obj["master_weights"]) != [e["path"][1] for e in mw]:
        fail(f"{path}: master_weights keys {list(obj['master_weights'])}")
    for e in top + mw:
        v = obj[e["path"][0]] if len(e["path"]) == 1 else obj["master_weights"][e["path"][1]]
        if type(v) is not tuple or len(v) != 2 or v[0] != e["name"]:
            fail(f"{path}: {e['path']}: not the tuple ({e['name']!r}, ndarray)")
        check_array(f"{path}: {e['path']}", v[1], e)


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "expected.json")) as f:
        exp = json.load(f)
    for name, e in exp.items():
        check(os.path.join(d, name), e)


if __name__ == "__main__":
    main()
