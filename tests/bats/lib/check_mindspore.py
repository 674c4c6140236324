#!/usr/bin/env python3
"""Oracle checker of a mounted flexfs mindspore/ tree (MindSpore .ckpt files).

Every MNT/mindspore/rank_N/checkpoint_N.ckpt is parsed the way MindSpore's
load_checkpoint parses it: python3-protobuf with the schema written from the
spec (tools/fixtures/mindspore/checkpoint.proto, compiled by protoc), then
consecutive Values with one tag joined, dims and tensor_type taken from the
last, the content turned into an array by the tensor_type's numpy dtype
(tools/fixtures/gen_mindspore.py's load_rank_file + entry_array, which also
decode every file with a hand-written wire decoder and re-encode each record
byte for byte).  Each tensor is compared with the ground truth sliced by an
independent implementation of the target layout:

  plan MNT TRUTH TP PP [RULES]
      TRUTH: a DCP fixture's truth dir (manifest.json + .bin files); rank
      N = pp * TP + tp holds, under its stage name, the box that
      check_views.expected_plan gives rank (tp, pp); a zero-element tensor
      has no record (docs/formats/mindspore.md#dims, the >= 2.3 writer).
  same MNT REF
      REF: what transform_checkpoints writes for the same source and
      strategies (rank_<r>/checkpoint_<r>.ckpt); each rank file must hold
      the same entries (order free).
  hf TRUTH OUT
      writes TRUTH's model parameters as OUT/model.safetensors (a source for
      strategy mode whose names are MindSpore's).
  strategy MNT TRUTH STRATEGY
      TRUTH: tests/fixtures/mindspore-truth (model/<name>.npy, manifest);
      STRATEGY: the destination strategy file; rank r holds, of every
      parameter with a layout on its stage, the docs/formats/mindspore.md#box-algorithm box
      (gen_mindspore.spec_box), and every parameter without a layout whole.

Output: one line per problem, then "N files equal"; exit 0 only when every
file was checked and equal.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools", "fixtures"))

import check_views  # noqa: E402
import gen_mindspore as gm  # noqa: E402

# torch dtype names of the DCP truth manifests -> MindSpore tensor_type
MS_TYPE = {
    "float64": "Float64", "float32": "Float32", "float16": "Float16",
    "bfloat16": "BFloat16", "int64": "Int64", "int32": "Int32",
    "int16": "Int16", "int8": "Int8", "uint8": "UInt8", "bool": "Bool",
    "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
}

failures = []


def bad(msg):
    failures.append(msg)
    print("FAIL " + msg)


def load(path):
    """-> {tag: entry} as load_checkpoint sees the file, or None."""
    try:
        ents, meta = gm.load_rank_file(path)
    except SystemExit as e:  # gen_mindspore.check() dies with the reason
        bad("%s: %s" % (path, e))
        return None
    if meta["kind"] != "plain":
        bad("%s: kind %s" % (path, meta["kind"]))
    return ents


def check_dirs(mnt, n):
    d = os.path.join(mnt, "mindspore")
    want = {"rank_%d" % r for r in range(n)}
    have = set(os.listdir(d))
    if have != want:
        bad("mindspore/: entries %s, want %s" % (sorted(have), sorted(want)))
    for r in range(n):
        rd = os.path.join(d, "rank_%d" % r)
        if os.path.isdir(rd) and os.listdir(rd) != ["checkpoint_%d.ckpt" % r]:
            bad("%s: entries %s" % (rd, os.listdir(rd)))


def compare(path, ents, want):
    """want: {tag: (tensor_type, dims, bytes)}."""
    if set(ents) != set(want):
        bad("%s: tags %s, want %s" % (path, sorted(ents), sorted(want)))
        return
    for tag, (ttype, dims, b) in want.items():
        e = ents[tag]
        if e["type"] != ttype or list(e["dims"]) != list(dims):
            bad("%s: %s: %s %s, want %s %s" % (path, tag, e["type"], e["dims"], ttype, dims))
            continue
        arr = gm.entry_array(e)  # load_checkpoint's dtype and reshape
        if list(arr.shape) != list(dims) or gm.raw_bytes(arr) != b:
            bad("%s: %s: bytes differ" % (path, tag))


def plan_mode(mnt, truth_dir, T, P, rules_path=None):
    truth = check_views.Truth(truth_dir)
    rules = check_views.load_rules(rules_path) if rules_path else []
    plan, errors = check_views.expected_plan(truth.manifest, T, P, rules)
    if errors:
        bad("oracle refuses the plan: %s" % errors)
        return 0
    check_dirs(mnt, T * P)
    n = 0
    for p in range(P):
        for t in range(T):
            r = p * T + t
            path = os.path.join(mnt, "mindspore", "rank_%d" % r, "checkpoint_%d.ckpt" % r)
            want = {}
            for fqn, x in plan.items():
                pl = x["placement"].get(check_views.rank_dir(t, p))
                if 0 in x["shape"]:
                    continue  # docs/formats/mindspore.md#dims: >= 2.3 writes no record for a zero-element tensor
                if pl is not None:
                    want[pl["name"]] = (MS_TYPE[x["dtype"]], pl["shape"],
                                        truth.box_bytes(fqn, pl["offset"], pl["shape"]))
            ents = load(path)
            if ents is not None:
                compare(path, ents, want)
                n += 1
    return n


def truth_model(truth_dir):
    """{name: (tensor_type, array)} of the model parameters of a MindSpore truth dir."""
    man = gm.json.load(open(os.path.join(truth_dir, "manifest.json")))
    out = {}
    for name, e in man["tensors"].items():
        if e.get("file"):
            out[name] = (e["dtype"], np.load(os.path.join(truth_dir, e["file"])))
    return out


def strategy_mode(mnt, truth_dir, strategy_path):
    full = truth_model(truth_dir)
    strat = gm.read_strategy(strategy_path)
    N = gm.stage_device_count(strat)
    stages = sorted({s for st in strat.values() for s in st})
    if stages != list(range(len(stages))):
        bad("strategy stages %s" % stages)
    n_ranks = N * len(stages)
    check_dirs(mnt, n_ranks)
    n = 0
    for r in range(n_ranks):
        s, l = divmod(r, N)
        path = os.path.join(mnt, "mindspore", "rank_%d" % r, "checkpoint_%d.ckpt" % r)
        ents = load(path)
        if ents is None:
            continue
        want = {}
        for name, (ttype, a) in full.items():
            L = gm.layout_for(strat, name, s)
            if L is None and name in strat:
                continue  # another stage's parameter
            start, ln = ([0] * a.ndim, list(a.shape)) if L is None else \
                gm.spec_box(L, list(a.shape), l)
            sl = tuple(slice(o, o + k) for o, k in zip(start, ln))
            want[name] = (ttype, ln, np.ascontiguousarray(a[sl]).tobytes())
        compare(path, ents, want)
        n += 1
    return n


def same_mode(mnt, ref_dir):
    """Every rank file holds what MindSpore's transform_checkpoints wrote for
    the same strategies (REF/rank_<r>/checkpoint_<r>.ckpt, from
    gen_mindspore.py transform): the same tags, tensor_types, dims and
    bytes (the order of the records is free: load_checkpoint makes a dict)."""
    ranks = sorted(int(d[5:]) for d in os.listdir(ref_dir) if d.startswith("rank_"))
    check_dirs(mnt, len(ranks))
    n = 0
    for r in ranks:
        rel = os.path.join("rank_%d" % r, "checkpoint_%d.ckpt" % r)
        ref = load(os.path.join(ref_dir, rel))
        ents = load(os.path.join(mnt, "mindspore", rel))
        if ref is None or ents is None:
            continue
        want = {k: (e["type"], e["dims"], gm.raw_bytes(gm.entry_array(e)))
                for k, e in ref.items()}
        compare(os.path.join(mnt, "mindspore", rel), ents, want)
        n += 1
    return n


ST_DTYPE = {"BFloat16": "BF16", "Float32": "F32", "Float16": "F16", "Int32": "I32",
            "Int64": "I64"}


def write_hf(truth_dir, out):
    """The truth's model parameters as one Hugging Face model.safetensors (a
    source whose names are MindSpore's)."""
    full = truth_model(truth_dir)
    hdr, blobs, off = {}, [], 0
    for name in sorted(full):
        ttype, a = full[name]
        b = np.ascontiguousarray(a).tobytes()
        hdr[name] = {"dtype": ST_DTYPE[ttype], "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = gm.json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    return 1


def main(argv):
    if len(argv) >= 5 and argv[0] == "plan":
        n = plan_mode(argv[1], argv[2], int(argv[3]), int(argv[4]),
                      argv[5] if len(argv) > 5 else None)
    elif len(argv) == 4 and argv[0] == "strategy":
        n = strategy_mode(argv[1], argv[2], argv[3])
    elif len(argv) == 3 and argv[0] == "same":
        n = same_mode(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "hf":
        n = write_hf(argv[1], argv[2])
        return 0
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if failures or n == 0:
        print("%d failed" % max(len(failures), 1))
        return 1
    print("%d files equal" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
