#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check a flexfs tree (a mount, or a copy of some of its files) with the
real loaders of whatever Python runs this script, against the tensors a
fixture's truth records, under the loader-compatibility rule of
docs/usage.md ("Dtypes older readers cannot hold"):

  safetensors files hold every dtype safetensors 0.4.5 parses (its Dtype
      enum: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 F64 I64
      U64); with --new also complex64 and the FNUZ float8s; never
      complex128;
  model.pt holds every dtype torch 1.13 has a storage class for; with
      --new every dtype;
  .npy holds every dtype;
  paddle/ (when DIR has it) every dtype; mindspore/ (when DIR has it) none
      MindSpore's load_checkpoint has no tensor_type for (complex64/128,
      the float8s): index.json's "left_out" names "pdparams" and
      "mindspore" by this rule where the tree serves them; every paddle/
      file is pickle.load'ed as paddle.load does (numpy's own arrays: bf16
      as uint16 bits, float8 as uint8) and its arrays compared by name
      with the truth (a model without optimizer state: every tensor a
      weight under its own name);
  megatron/ (--megatron FIXTURE, a tests/fixtures/megatron-* directory,
      tp=1) the torch.save rule: every model_optim_rng.pt torch.load'ed
      (with --stub, tools/fixtures/megatron_stub, on sys.path), its
      "model" tensors compared by name with FIXTURE/truth/manifest.json
      "model" (legacy names, per-layer .npy), their dtypes those of
      "retyped" (tools/fixtures/gen_megatron_retype.py) where it names their
      torch_dist key;
  --exclude DT,DT: those dtypes are in no file.

    check_dtypes.py --root DIR --truth FILE [--new] [--exclude a,b]
                    [--megatron FIXTURE --stub DIR]
                    [--only safetensors|pt|npy|index|megatron]...

FILE: a fixture's truth/manifest.json (tensors with dtype, shape, sha256;
Paddle's: checkpoints[0].tensors with paddle_dtype) or a dcp digest.txt
("sha256 dtype shape fqn", torch's own load).  Every safetensors file of
DIR/ranks/tp00_pp00 and DIR/hf (tp=1, pp=1: whole tensors under their
names) is opened with safetensors.safe_open (framework "pt" when torch
imports, else "numpy" for the dtypes numpy has) when the safetensors
package imports, else parsed by this script; every model.pt is
torch.load'ed; every .npy np.load'ed; index.json's "left_out" must name
exactly the formats the rule leaves out.  Prints "N checks ok" or the
failures (exit 1).
"""
import argparse
import glob
import hashlib
import json
import os
import struct
import sys
import urllib.parse

import numpy as np

ST_045 = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16",
          "int8", "uint8", "bool", "uint16", "uint32", "uint64", "float8_e4m3fn",
          "float8_e5m2"}
ST_NEW = ST_045 | {"complex64", "float8_e4m3fnuz", "float8_e5m2fnuz"}
# torch 1.13's typed storages (torch/storage.py): the dtypes it loads
PT_113 = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16",
          "int8", "uint8", "bool", "complex64", "complex128"}
ST_NAME = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
           "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
           "bool": "BOOL", "uint16": "U16", "uint32": "U32", "uint64": "U64",
           "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64",
           "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ"}
SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
        "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
        "C64": 8, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1}
# numpy types of the dtypes np.frombuffer / safetensors' numpy side know
NP_OK = {"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8",
         "bool", "uint16", "uint32", "uint64", "complex64", "complex128"}


# MindSpore's tensor_type names (docs/formats/mindspore.md): none for these
MS_NEVER = {"complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
            "float8_e5m2fnuz"}


def megatron_truth(fix):
    """{legacy name: (dtype, sha256)} of a Megatron fixture's per-layer
    truth, under the dtypes of its "retyped" (the bytes are the same)."""
    man = json.load(open(os.path.join(fix, "truth", "manifest.json")))
    retyped = man.get("retyped", {}).get("tensors", {})
    out = {}
    for name, e in man["model"].items():
        b = np.ascontiguousarray(np.load(os.path.join(fix, "truth", e["file"]))).tobytes()
        out[name] = (retyped.get(e["dcp_key"], e["dtype"]), sha(b))
    return out


def load_truth(path):
    """{fqn: (dtype, sha256)}"""
    out = {}
    if path.endswith(".txt"):
        for line in open(path):
            if line.startswith("#") or not line.strip():
                continue
            sha, dt, _shape, fqn = line.rstrip("\n").split(" ", 3)
            out[fqn] = (dt, sha)
        return out
    m = json.load(open(path))
    if "tensors" in m:
        for k, e in m["tensors"].items():
            out[k] = (e["dtype"], e["sha256"])
    else:
        for k, e in m["checkpoints"][0]["tensors"].items():
            out[k] = (e["paddle_dtype"], e["sha256"])
    return out


class Rep:
    def __init__(self):
        self.ok = 0
        self.bad = []

    def check(self, cond, what):
        if cond:
            self.ok += 1
        else:
            self.bad.append(what)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def torch_bytes(torch, t):
    """The C-order little-endian bytes of tensor t, by torch alone."""
    t = t.reshape(-1).contiguous()
    if t.numel() == 0:
        return b""
    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if t.dtype in (torch.complex64, torch.complex128, torch.bool):
        return t.numpy().tobytes()
    return t.view(by_size[t.element_size()]).numpy().tobytes()


def parse_st(path):
    """This script's own reader: {name: (dtype, bytes)}."""
    data = open(path, "rb").read()
    n = struct.unpack_from("<Q", data)[0]
    h = json.loads(data[8:8 + n])
    h.pop("__metadata__", None)
    start = 8 + n
    return {k: (e["dtype"], data[start + e["data_offsets"][0]:start + e["data_offsets"][1]])
            for k, e in h.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--new", action="store_true")
    ap.add_argument("--exclude", default="")
    ap.add_argument("--only", action="append")
    ap.add_argument("--megatron")
    ap.add_argument("--stub")
    a = ap.parse_args()
    truth = load_truth(a.truth)
    excl = set(x for x in a.exclude.split(",") if x)
    parts = set(a.only or ["safetensors", "pt", "npy", "index", "megatron", "pdparams"])
    st_set = (ST_NEW if a.new else ST_045) - excl
    pt_set = None if a.new else PT_113
    rep = Rep()
    try:
        import torch
    except ImportError:
        torch = None

    def pt_holds(dt):
        return dt not in excl and (pt_set is None or dt in pt_set)

    want = {"safetensors": {k for k, (dt, _) in truth.items() if dt in st_set},
            "torch.save": {k for k, (dt, _) in truth.items() if pt_holds(dt)},
            "npy": {k for k, (dt, _) in truth.items() if dt not in excl}}
    if os.path.isdir(os.path.join(a.root, "paddle")):
        want["pdparams"] = set(want["npy"])
    if os.path.isdir(os.path.join(a.root, "mindspore")):
        want["mindspore"] = {k for k in want["npy"] if truth[k][0] not in MS_NEVER}

    if "safetensors" in parts:
        files = glob.glob(os.path.join(a.root, "hf", "*.safetensors")) + \
            glob.glob(os.path.join(a.root, "ranks", "tp00_pp00", "model.safetensors"))
        rep.check(files, "no safetensors file under %s" % a.root)
        try:
            from safetensors import safe_open
        except ImportError:
            safe_open = None
        for f in files:
            rel = os.path.relpath(f, a.root)
            own = parse_st(f)
            names = set(own)
            if safe_open is not None:
                fw = "pt" if torch is not None else "numpy"
                try:
                    with safe_open(f, framework=fw) as sf:
                        names = set(sf.keys())
                        for k in names:
                            if fw == "numpy" and truth[k][0] not in NP_OK:
                                continue
                            t = sf.get_tensor(k)
                            b = torch_bytes(torch, t) if fw == "pt" else \
                                np.ascontiguousarray(t).tobytes()
                            rep.check(sha(b) == truth[k][1],
                                      "%s: %s: safe_open gives other bytes" % (rel, k))
                except Exception as e:
                    rep.check(False, "%s: safe_open failed: %s: %s" % (rel, type(e).__name__, e))
            for k, (dt, b) in own.items():
                rep.check(k in truth and dt == ST_NAME.get(truth[k][0]) and
                          sha(b) == truth[k][1], "%s: %s: dtype or bytes differ" % (rel, k))
            rep.check(names == want["safetensors"], "%s: holds %s, expected %s"
                      % (rel, sorted(names), sorted(want["safetensors"])))

    if "pt" in parts and torch is not None:
        for f in glob.glob(os.path.join(a.root, "ranks", "*", "model.pt")):
            rel = os.path.relpath(f, a.root)
            try:
                sd = torch.load(f)
            except Exception as e:
                rep.check(False, "%s: torch %s cannot load it: %s: %s"
                          % (rel, torch.__version__, type(e).__name__, e))
                continue
            if "tp00_pp00" in rel:
                rep.check(set(sd) == want["torch.save"], "%s: holds %s, expected %s"
                          % (rel, sorted(sd), sorted(want["torch.save"])))
            for k, t in sd.items():
                rep.check(k in truth and str(t.dtype) == "torch." + truth[k][0] and
                          sha(torch_bytes(torch, t)) == truth[k][1],
                          "%s: %s: dtype or bytes differ" % (rel, k))

    if "npy" in parts:
        tdir = os.path.join(a.root, "ranks", "tp00_pp00", "tensors")
        have = set()
        for f in glob.glob(os.path.join(tdir, "*.npy")):
            k = urllib.parse.unquote(os.path.basename(f)[:-4])
            have.add(k)
            try:
                arr = np.load(f)
                rep.check(k in truth and sha(np.ascontiguousarray(arr).tobytes()) == truth[k][1],
                          "%s: np.load gives other bytes" % k)
            except Exception as e:
                rep.check(False, "%s: np.load failed: %s: %s" % (k, type(e).__name__, e))
        rep.check(have == want["npy"], "tensors/: holds %s, expected %s"
                  % (sorted(have), sorted(want["npy"])))

    pd_dir = os.path.join(a.root, "paddle")
    if "pdparams" in parts and os.path.isdir(pd_dir):
        import pickle
        have = set()
        for f in sorted(glob.glob(os.path.join(pd_dir, "*.pdparams"))):
            rel = os.path.relpath(f, a.root)
            try:
                with open(f, "rb") as fh:
                    d = pickle.load(fh, encoding="latin1")
            except Exception as e:
                rep.check(False, "%s: numpy %s cannot load it: %s: %s"
                          % (rel, np.__version__, type(e).__name__, e))
                continue
            for k, v in d.items():
                if not isinstance(v, np.ndarray):
                    continue
                have.add(k)
                rep.check(k in truth and sha(np.ascontiguousarray(v).tobytes()) == truth[k][1],
                          "%s: %s: other bytes" % (rel, k))
        rep.check(have == want["pdparams"], "paddle/: holds %s, expected %s"
                  % (sorted(have), sorted(want["pdparams"])))

    if "megatron" in parts and a.megatron and torch is not None:
        if a.stub:
            sys.path.insert(0, a.stub)
        mt = megatron_truth(a.megatron)
        files = glob.glob(os.path.join(a.root, "megatron", "*", "*", "model_optim_rng.pt"))
        rep.check(len(files) == 1, "megatron/: %d files at tp=1, pp=1" % len(files))
        for f in files:
            rel = os.path.relpath(f, a.root)
            try:
                # the args Namespace: weights_only=False (torch 2.6's default
                # refuses it), as Megatron's own loader does
                sd = torch.load(f, weights_only=False)["model"]
            except Exception as e:
                rep.check(False, "%s: torch %s cannot load it: %s: %s"
                          % (rel, torch.__version__, type(e).__name__, e))
                continue
            have = {k for k, t in sd.items() if torch.is_tensor(t) and not k.endswith("_extra_state")}
            exp = {k for k, (dt, _) in mt.items() if pt_holds(dt)}
            rep.check(have == exp, "%s: holds %s, expected %s" % (rel, sorted(have), sorted(exp)))
            for k in have & set(mt):
                t = sd[k]
                rep.check(str(t.dtype) == "torch." + mt[k][0] and
                          sha(torch_bytes(torch, t)) == mt[k][1],
                          "%s: %s: dtype or bytes differ" % (rel, k))

    if "index" in parts:
        idx = json.load(open(os.path.join(a.root, "index.json")))["tensors"]
        for k, (dt, _) in truth.items():
            lo = idx[k].get("left_out", {})
            exp = {f for f in want if k not in want[f]}
            rep.check(set(lo) == exp and all(isinstance(v, str) and v for v in lo.values()),
                      "index.json %s: left_out %r, expected %s" % (k, lo, sorted(exp)))
            rep.check(idx[k]["in_safetensors"] == (k in want["safetensors"]),
                      "index.json %s: in_safetensors" % k)

    for b in rep.bad:
        print("FAIL " + b)
    print("%d checks ok, %d failed" % (rep.ok, len(rep.bad)))
    return 1 if rep.bad else 0


if __name__ == "__main__":
    sys.exit(main())
