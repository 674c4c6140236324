#!/usr/bin/env python3
"""Build a check_views.py truth dir for a tests/fixtures/megatron-* fixture.

The fixture's own truth holds every model tensor per global layer (and
expert) under its legacy name (truth/manifest.json "model", with the
torch_dist key and its index along the stacked axes); the optimizer truth
comes from `gen_megatron.py truth` (numpy only).  This stacks them into the
torch_dist global tensors (docs/formats/megatron.md#stacked-layers: layers on axis 0,
experts on axis 1), takes each tensor's chunk offsets and every bytes item
from the fixture's .metadata (unpickled here by class name, with Python's
own unpickler: nothing executed, nothing of flexfs used), and writes

  OUT/manifest.json   {"tensors": {key: {dtype, shape, file, itemsize,
                       nbytes, sha256, chunks, stacked}}, "objects": {...}}
  OUT/<n>.bin         raw little-endian bytes, C order

"stacked" is the number of leading axes that stack layers/experts (the
key convention of the spec: "decoder.layers." + non-digit, and
"experts.experts." after it; a layer's own key "decoder.layers.<N>." keeps
only its expert axis, marked "layer_axis": false); check_views.py never
TP-splits them.

Usage: megatron_truth.py FIXTURE_DIR OUT_DIR   (/usr/bin/python3: numpy)
"""

import hashlib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "..", "..", "tools", "fixtures", "gen_megatron.py")


class Obj:
    """Any pickled class instance: constructor args and BUILD state kept."""

    def __init__(self, *args, **kw):
        self.args = args
        self.__dict__.update(kw)

    def __setstate__(self, st):
        self.state = st
        if isinstance(st, tuple) and len(st) == 2:  # (dict, slots)
            st = {**(st[0] or {}), **(st[1] or {})}
        if isinstance(st, dict):
            self.__dict__.update(st)

    def __hash__(self):
        return id(self)


def cls_factory(module, name):
    if module == "torch" and name == "Size":
        return lambda t=(): tuple(t)
    if module == "torch":
        return name  # torch.float32 etc. (GLOBAL, never called)
    return type(name, (Obj,), {"_module": module})


class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "builtins" and name in ("set", "frozenset", "tuple", "list", "dict"):
            return getattr(__builtins__, name) if hasattr(__builtins__, name) else __builtins__[name]
        if module == "collections" and name == "OrderedDict":
            return dict
        return cls_factory(module, name)


def load_metadata(path):
    with open(path, "rb") as f:
        md = Unpickler(f).load()
    assert type(md).__name__ in ("Metadata", "MCoreMetadata"), type(md).__name__
    return md


def stacked_axes(key):
    # docs/formats/megatron.md#moe-experts: prepended [layer, expert]; a layer's own key (3.2) keeps the expert axis only
    m = re.search(r"(^|\.)decoder\.layers\.(.)", key)
    if not m:
        return 0
    experts = "experts.experts." in key[m.end(2) - 1:]
    if m.group(2).isdigit():
        return 1 if experts else 0
    return 2 if experts else 1


def dtype_name(props):
    # TensorProperties pickles its state as (dtype, layout, ...)
    d = getattr(props, "dtype", None) or props.state[0]
    return {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
            "uint32": "uint32"}[d]


def load_npy(path, dtype):
    a = np.load(path)
    want = {"float32": "<f4", "bfloat16": "<u2", "float16": "<f2"}[dtype]
    assert a.dtype == np.dtype(want), (path, a.dtype, want)
    return a


def main():
    fix, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(fix, "truth", "manifest.json")) as f:
        man = json.load(f)
    ck = os.path.normpath(os.path.join(fix, "truth", man["checkpoint"]))
    md = load_metadata(os.path.join(ck, ".metadata"))
    sdm = md.state_dict_metadata

    arrays = {}
    parts = {}
    for name, e in man["model"].items():
        parts.setdefault(e["dcp_key"], []).append(
            (tuple(e["dcp_index"]), load_npy(os.path.join(fix, "truth", e["file"]), e["dtype"])))
    for key, ps in parts.items():
        size = tuple(sdm[key].size)
        n = len(ps[0][0])
        a = np.zeros(size, dtype=ps[0][1].dtype)
        for idx, v in ps:
            assert a[idx].shape == v.shape, (key, idx, a[idx].shape, v.shape)
            a[idx] = v
        assert len(ps) == int(np.prod(size[:n])), key
        arrays[key] = a
    # fully_sharded_model_space (docs/formats/megatron.md#fully-sharded-model-space): a reformulated
    # optimizer tensor is expected under its original shape, saved split
    # as its model tensor (whose chunks stand for it here)
    mcore = getattr(md, "mcore_data", None) or {}
    orig = {k: tuple(v["nd_reformulated_orig_global_shape"]) for k, v in mcore.items()
            if isinstance(v, dict) and "nd_reformulated_orig_global_shape" in v}
    size_of = {k: tuple(v.size) for k, v in sdm.items() if hasattr(v, "chunks")}
    chunks_of = {k: v.chunks for k, v in sdm.items() if hasattr(v, "chunks")}
    for key, shape in orig.items():
        model = re.sub(r"^optimizer\.state\.[a-z0-9_]+\.", "", key)
        assert tuple(sdm[model].size) == shape, (key, shape)
        size_of[key] = shape
        chunks_of[key] = sdm[model].chunks
    if man.get("optim"):
        with tempfile.TemporaryDirectory() as td:
            subprocess.run([sys.executable, GEN, "truth", "--src", fix, "--out", td]
                           + (["--model-space"] if orig else []),
                           check=True, stdout=subprocess.DEVNULL)
            for key, e in man["optim"].items():
                a = load_npy(os.path.join(td, e["file"]), e["dtype"])
                assert list(a.shape) == list(size_of[key]), key
                arrays[key] = a

    os.makedirs(out, exist_ok=True)
    tensors, objects = {}, {}
    for i, (key, tsm) in enumerate(sdm.items()):
        if not hasattr(tsm, "chunks"):
            continue
        assert key in arrays, "no truth for %s" % key
        a = np.ascontiguousarray(arrays[key])
        dt = dtype_name(tsm.properties)
        assert list(a.shape) == list(size_of[key]), key
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        fn = "%04d.bin" % i
        with open(os.path.join(out, fn), "wb") as f:
            f.write(b)
        tensors[key] = {
            "dtype": dt, "shape": list(a.shape), "file": fn, "itemsize": a.dtype.itemsize,
            "nbytes": len(b), "sha256": hashlib.sha256(b).hexdigest(),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)}
                       for c in chunks_of[key]],
            "stacked": stacked_axes(key),
        }
        if re.search(r"(^|\.)decoder\.layers\.\d", key) and tensors[key]["stacked"]:
            tensors[key]["layer_axis"] = False   # a layer's own key: axis 0 is experts
    assert set(arrays) == set(tensors), set(arrays) ^ set(tensors)
    for mi, si in md.storage_data.items():
        if getattr(mi, "offset", None) is not None:
            continue
        with open(os.path.join(ck, si.relative_path), "rb") as f:
            f.seek(si.offset)
            b = f.read(si.length)
        assert len(b) == si.length
        objects[mi.fqn] = {"length": len(b), "sha256": hashlib.sha256(b).hexdigest()}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"tensors": tensors, "objects": objects}, f, indent=1)
    print("megatron_truth: %d tensors, %d objects" % (len(tensors), len(objects)))


if __name__ == "__main__":
    main()
