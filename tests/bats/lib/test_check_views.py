#!/usr/bin/env python3
"""Self-test of check_views.py: prove the oracle passes a correct tree and
catches broken ones, before (and independently of) flexfs.

A fake "mount" is written from a fixture's truth by this file's own writers
(safetensors, npy, index.json, hf/, objects/) using a second, separately
written placement (numpy.array_split for the stage groups, Python range
slicing for the torch.chunk boxes, chunk *sizes* instead of offsets for the
split inference).  The checker must accept it; then single defects are
injected (a flipped data byte, a bad npy header, a dropped tensor, a wrong
offset in index.json, ...) and each must be reported with a non-zero exit.

Usage: test_check_views.py [--fixtures DIR] [--real-safetensors] [--keep]
Runs with /usr/bin/python3 (numpy) and in the trixie chroot (numpy 2.x,
where --real-safetensors also loads every file with the real library).
"""

import argparse
import fnmatch
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check_views.py")

ST = {"float64": ("F64", 8), "float32": ("F32", 4), "float16": ("F16", 2),
      "bfloat16": ("BF16", 2), "int64": ("I64", 8), "int32": ("I32", 4), "int8": ("I8", 1),
      "bool": ("BOOL", 1), "uint16": ("U16", 2), "float8_e4m3fn": ("F8_E4M3", 1)}
DESCR = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<u2",
         "int64": "<i8", "int32": "<i4", "int8": "|i1", "bool": "|b1", "uint16": "<u2",
         "float8_e4m3fn": "|u1"}


# ---------------------------------------------------------------------------
# an independent placement (deliberately formulated differently)


def layout(man, T, P, rule_split, renumber):
    """-> {fqn: dict(axis, stages, names{stage: name}, layer, boxes[t] = (off, ext))}"""
    lay = {}
    for fqn in man["tensors"]:
        parts = fqn.split(".")
        for i in range(len(parts) - 2):
            if parts[i] == "layers" and parts[i + 1].isdigit():
                lay[fqn] = (i + 1, int(parts[i + 1]))
                break
    groups = [list(g) for g in np.array_split(np.array(sorted({v[1] for v in lay.values()}),
                                                       dtype=np.int64), P)]
    stage_of = {int(l): s for s, g in enumerate(groups) for l in g}
    out = {}
    for fqn, e in man["tensors"].items():
        shape = e["shape"]
        if fqn in rule_split:
            axis = rule_split[fqn]
        else:
            cut = [d for d in range(len(shape))
                   if any(c["sizes"][d] != shape[d] for c in e["chunks"])]
            assert len(cut) <= 1, fqn
            axis = cut[0] if cut else None
        if fqn in lay:
            stages = [stage_of[lay[fqn][1]]]
        elif re.search(r"(^|\.)(tok_embeddings|embed_tokens|word_embeddings|wte)(\.|$)", fqn):
            stages = [0]
        else:
            stages = [P - 1]
        names = {}
        for s in stages:
            if renumber and fqn in lay:
                parts = fqn.split(".")
                parts[lay[fqn][0]] = str(lay[fqn][1] - int(groups[s][0]))
                names[s] = ".".join(parts)
            else:
                names[s] = fqn
        boxes = []
        for t in range(T):
            off, ext = [0] * len(shape), list(shape)
            if axis is not None:
                n = shape[axis]
                c = math.ceil(n / T)
                r = range(n)[t * c:(t + 1) * c]
                off[axis], ext[axis] = r.start if len(r) else n, len(r)
            boxes.append((off, ext))
        out[fqn] = dict(axis=axis, stages=stages, names=names,
                        layer=lay[fqn][1] if fqn in lay else None, boxes=boxes)
    return out


# ---------------------------------------------------------------------------
# writers


def truth_array(tdir, e):
    isz = ST[e["dtype"]][1]
    b = open(os.path.join(tdir, e["file"]), "rb").read()
    return np.frombuffer(b, dtype=np.dtype("<u%d" % isz) if isz > 1 else np.uint8).reshape(e["shape"])


def box_bytes(a, off, ext):
    return np.ascontiguousarray(a[tuple(slice(o, o + n) for o, n in zip(off, ext))]).tobytes()


def write_safetensors(path, tensors, meta):
    """tensors: list of (name, dtype, shape, bytes)."""
    order = sorted(tensors, key=lambda t: (-ST[t[1]][1], t[0]))
    hdr, pos = {"__metadata__": meta}, 0
    for name, dt, shape, b in order:
        hdr[name] = {"dtype": ST[dt][0], "shape": list(shape), "data_offsets": [pos, pos + len(b)]}
        pos += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((-(8 + len(h))) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in order:
            f.write(t[3])


PT_STORAGE = {"float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage",
              "bfloat16": "BFloat16Storage", "int64": "LongStorage", "int32": "IntStorage",
              "int8": "CharStorage", "bool": "BoolStorage"}


def pk_int(v):
    if v < 256:
        return b"K" + bytes([v])
    if v < 65536:
        return b"M" + struct.pack("<H", v)
    return b"J" + struct.pack("<i", v)


def pk_tuple(vals):
    body = b"".join(pk_int(v) for v in vals)
    if not vals:
        return b")"
    return body + b"\x85\x86\x87"[len(vals) - 1:len(vals)] if len(vals) <= 3 else b"(" + body + b"t"


def pk_str(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def write_model_pt(path, tensors):
    """tensors: list of (name, dtype, shape, bytes); a torch.save zip of an
    OrderedDict written from docs/formats/torch-save.md (no zip64: small)."""
    odict = b"ccollections\nOrderedDict\n)R"
    pk = b"\x80\x02" + odict + (b"(" if tensors else b"")
    for k, (name, dt, shape, b) in enumerate(tensors):
        stride, acc = [], 1
        for n in reversed(shape):
            stride.insert(0, acc)
            acc *= max(n, 1)
        cls = PT_STORAGE.get(dt)
        pk += pk_str(name) + b"ctorch._utils\n_rebuild_tensor_v%d\n" % (2 if cls else 3)
        pk += b"((" + pk_str("storage")
        pk += (b"ctorch\n%s\n" % cls.encode()) if cls else b"ctorch.storage\nUntypedStorage\n"
        pk += pk_str(str(k)) + pk_str("cpu")
        pk += pk_int(len(b) // ST[dt][1] if cls else len(b)) + b"tQ" + pk_int(0)
        pk += pk_tuple(list(shape)) + pk_tuple(stride) + b"\x89" + odict
        pk += (b"" if cls else b"ctorch\n%s\n" % dt.encode()) + b"tR"
    pk += (b"u" if tensors else b"") + b"."
    recs = [("data.pkl", pk, True), ("byteorder", b"little", True)]
    recs += [("data/%d" % k, t[3], False) for k, t in enumerate(tensors)]
    recs += [("version", b"3\n", True)]
    out, cd = bytearray(), bytearray()
    for name, data, literal in recs:
        full, h, n = ("archive/" + name).encode(), len(out), len(data)
        pad = (-(h + 30 + len(full) + 4)) % 64
        crc = zlib.crc32(data) if literal else 0  # torch.load checks no CRC
        flags = 0x0808 if n else 0x0800
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0,
                           len(full), 4 + pad)
        out += full + b"FB" + struct.pack("<H", pad) + b"Z" * pad + data
        if n:
            out += struct.pack("<IIII", 0x08074B50, crc, n, n)
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, flags, 0, 0, 0, crc, n, n,
                          len(full), 0, 0, 0, 0, 0, h) + full
    cdoff, n = len(out), len(recs)
    out += cd
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, len(cd), cdoff)
    out += struct.pack("<IIQI", 0x07064B50, 0, cdoff + len(cd), 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(cd), cdoff, 0)
    with open(path, "wb") as f:
        f.write(out)


def write_npy(path, dtype, shape, b):
    arr = np.frombuffer(b, dtype=np.dtype(DESCR[dtype])).reshape(shape)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=(1, 0))


def build_tree(root, fixture, T, P, rules, renumber=False, hf_shards=0):
    tdir = os.path.join(fixture, "truth")
    man = json.load(open(os.path.join(tdir, "manifest.json")))
    ckpt = os.path.normpath(os.path.join(tdir, man["checkpoint"]))
    rule_split = {}
    for fqn in man["tensors"]:
        for r in rules:
            if fnmatch.fnmatchcase(fqn, r["match"]):
                if "split" in r:
                    rule_split[fqn] = r["split"]
                break
    lay = layout(man, T, P, rule_split, renumber)
    arrays = {f: truth_array(tdir, e) for f, e in man["tensors"].items()}
    index = {"source": {"format": "dcp", "path": ckpt}, "target": {"tp": T, "pp": P},
             "tensors": {}, "objects": {}}
    per_rank = {}
    for fqn, e in man["tensors"].items():
        L = lay[fqn]
        pl = {}
        for s in L["stages"]:
            for t in range(T):
                off, ext = L["boxes"][t]
                rd = "tp%02d_pp%02d" % (t, s)
                pl[rd] = {"name": L["names"][s], "offset": off, "shape": ext}
                per_rank.setdefault(rd, []).append((L["names"][s], fqn, off, ext))
        index["tensors"][fqn] = {"dtype": e["dtype"], "shape": e["shape"],
                                 "split_axis": L["axis"], "stage_lo": min(L["stages"]),
                                 "stage_hi": max(L["stages"]), "layer": L["layer"],
                                 "placement": pl}
    os.makedirs(os.path.join(root, "objects"))
    for fqn, o in man.get("objects", {}).items():
        with open(os.path.join(ckpt, o["file"]), "rb") as f:
            f.seek(o["offset"])
            b = f.read(o["length"])
        with open(os.path.join(root, "objects", fqn + ".pt"), "wb") as f:
            f.write(b)
        index["objects"][fqn] = {"path": "objects/%s.pt" % fqn, "bytes": len(b)}
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    for t in range(T):
        for s in range(P):
            rd = "tp%02d_pp%02d" % (t, s)
            d = os.path.join(root, "ranks", rd)
            os.makedirs(os.path.join(d, "tensors"))
            items, fm = [], {}
            for name, fqn, off, ext in per_rank.get(rd, []):
                dt = man["tensors"][fqn]["dtype"]
                b = box_bytes(arrays[fqn], off, ext)
                items.append((name, dt, ext, b))
                fm[name] = {"source": fqn, "global_shape": man["tensors"][fqn]["shape"],
                            "global_offset": off, "split_axis": lay[fqn]["axis"]}
                write_npy(os.path.join(d, "tensors", name + ".npy"), dt, ext, b)
            meta = {"format": "pt", "flexfs": json.dumps(
                {"tp": T, "pp": P, "rank": {"tp": t, "pp": s}, "tensors": fm})}
            write_safetensors(os.path.join(d, "model.safetensors"), items, meta)
            write_model_pt(os.path.join(d, "model.pt"), items)
    hf = os.path.join(root, "hf")
    os.makedirs(hf)
    full = [(f, e["dtype"], e["shape"], arrays[f].tobytes()) for f, e in man["tensors"].items()]
    if hf_shards:
        n = hf_shards
        wm, total = {}, 0
        for i in range(n):
            fn = "model-%05d-of-%05d.safetensors" % (i + 1, n)
            part = full[i::n]
            for t in part:
                wm[t[0]] = fn
                total += len(t[3])
            write_safetensors(os.path.join(hf, fn), part, {"format": "pt"})
        with open(os.path.join(hf, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f)
    else:
        write_safetensors(os.path.join(hf, "model.safetensors"), full, {"format": "pt"})
    for name in man.get("aux_files", {}):
        shutil.copyfile(os.path.join(ckpt, name), os.path.join(hf, name))
    return man


# ---------------------------------------------------------------------------
# defects


def flip(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


def st_header(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data)
    return json.loads(data[8:8 + n]), 8 + n, data


def st_rewrite_without(path, drop):
    hdr, start, data = st_header(path)
    meta = hdr.pop("__metadata__")
    items = []
    inv = {v[0]: k for k, v in ST.items()}
    for name, e in hdr.items():
        if name != drop:
            b, en = e["data_offsets"]
            items.append((name, inv[e["dtype"]], e["shape"], data[start + b:start + en]))
    write_safetensors(path, items, meta)


def edit_json(path, fn):
    d = json.load(open(path))
    fn(d)
    json.dump(d, open(path, "w"))


def st_edit_meta(path, fn):
    hdr, start, data = st_header(path)
    meta = hdr["__metadata__"]
    fx = json.loads(meta["flexfs"])
    fn(fx)
    meta["flexfs"] = json.dumps(fx)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((-(8 + len(h))) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data[start:])


def pt_data_pos(path, k):
    b = open(path, "rb").read()
    i = b.index(b"archive/data/%d" % k) - 30
    n, m = struct.unpack_from("<HH", b, i + 26)
    return i + 30 + n + m


def tensor_data_pos(path, name):
    hdr, start, _ = st_header(path)
    b, e = hdr[name]["data_offsets"]
    assert e > b
    return start + (b + e) // 2


# ---------------------------------------------------------------------------


class Runner:
    def __init__(self, python, real, keep):
        self.python = python
        self.real = real
        self.keep = keep
        self.failures = 0
        self.count = 0

    def run(self, mount, truth, T, P, rules, extra=()):
        # build_tree() writes every tensor into every file, as a mount
        # with new_dtypes=1 serves them
        cmd = [self.python, CHECKER, "--mount", mount, "--truth", truth,
               "--tp", str(T), "--pp", str(P), "-q", "--new-dtypes"]
        if rules:
            cmd += ["--rules", rules]
        if self.real:
            cmd.append("--real-safetensors")
        cmd += list(extra)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return p.returncode, p.stdout.decode()

    def expect(self, label, rc, out, ok, needles=()):
        self.count += 1
        good = (rc == 0) if ok else (rc != 0)
        last = out.strip().splitlines()[-1] if out.strip() else ""
        good = good and all(n in out for n in needles)
        if ok:
            good = good and last.endswith(" 0 failed")
        print("%s %s (rc=%d; %s)" % ("ok  " if good else "FAIL", label, rc, last))
        if not good:
            self.failures += 1
            sys.stdout.write("".join("    | " + line + "\n" for line in out.splitlines()[:40]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", default=os.path.normpath(os.path.join(HERE, "..", "..", "fixtures")))
    ap.add_argument("--python", default=sys.executable, help="interpreter for the checker")
    ap.add_argument("--real-safetensors", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary trees")
    args = ap.parse_args()
    R = Runner(args.python, args.real_safetensors, args.keep)
    rules_path = os.path.join(args.fixtures, "rules.json")
    rules = json.load(open(rules_path))
    work = tempfile.mkdtemp(prefix="check_views_test.")
    try:
        fx = os.path.join(args.fixtures, "dcp-t113")
        truth = os.path.join(fx, "truth")
        good = os.path.join(work, "good")
        build_tree(good, fx, 2, 1, rules)
        rc, out = R.run(good, truth, 2, 1, rules_path)
        R.expect("t113 tp=2 pp=1: correct tree passes", rc, out, True)

        def case(label, mutate, needles, T=2, P=1, rules_arg=rules_path, extra=()):
            d = os.path.join(work, "case%02d" % R.count)
            shutil.copytree(good, d)
            mutate(d)
            rc, out = R.run(d, truth, T, P, rules_arg, extra)
            R.expect(label, rc, out, False, needles)
            if not args.keep:
                shutil.rmtree(d)

        st1 = "ranks/tp01_pp00/model.safetensors"
        case("flipped data byte in a rank safetensors",
             lambda d: flip(os.path.join(d, st1), tensor_data_pos(os.path.join(d, st1), "output.weight")),
             ["FAIL " + st1 + ": output.weight: data differs"])
        pt1 = "ranks/tp01_pp00/model.pt"
        case("flipped data byte in a rank model.pt",
             lambda d: flip(os.path.join(d, pt1), pt_data_pos(os.path.join(d, pt1), 0)),
             ["FAIL " + pt1 + ": tok_embeddings.weight: data/0 differs from the truth"])
        case("model.pt removed",
             lambda d: os.remove(os.path.join(d, "ranks/tp00_pp00/model.pt")),
             ["ranks/tp00_pp00/model.pt: cannot read"])
        case("model.pt data.pkl byte changed (its CRC no longer matches)",
             lambda d: flip(os.path.join(d, pt1), 64 + 3),
             [pt1 + ": not a torch.save zip"])
        case("corrupt npy header (descr <u2 -> <f2)",
             lambda d: (lambda p: open(p, "r+b").write(open(p, "rb").read().replace(b"'<u2'", b"'<f2'", 1)))(
                 os.path.join(d, "ranks/tp00_pp00/tensors/tok_embeddings.weight.npy")),
             ["tok_embeddings.weight.npy: npy descr '<f2'"])
        case("corrupt npy magic",
             lambda d: flip(os.path.join(d, "ranks/tp01_pp00/tensors/norm.weight.npy"), 1),
             ["tensors/norm.weight.npy: bad npy magic"])
        case("flipped npy data byte",
             lambda d: flip(os.path.join(d, "ranks/tp00_pp00/tensors/block.weight.npy"), 130),
             ["tensors/block.weight.npy: npy data differs"])
        case("tensor dropped from a rank safetensors",
             lambda d: st_rewrite_without(os.path.join(d, st1), "norm.weight"),
             [st1 + ": norm.weight: missing tensor"])
        case("npy file removed",
             lambda d: os.remove(os.path.join(d, "ranks/tp01_pp00/tensors/buffers.ids.npy")),
             ["tensors/buffers.ids.npy: missing"])
        case("wrong placement offset in index.json",
             lambda d: edit_json(os.path.join(d, "index.json"),
                                 lambda j: j["tensors"]["output.weight"]["placement"]["tp01_pp00"]
                                 .__setitem__("offset", [4, 0])),
             ["index.json: output.weight: placement tp01_pp00 offset = [4, 0], expected [5, 0]"])
        case("wrong split_axis in index.json",
             lambda d: edit_json(os.path.join(d, "index.json"),
                                 lambda j: j["tensors"]["block.weight"].__setitem__("split_axis", 0)),
             ["index.json: block.weight: split_axis = 0, expected 1"])
        case("trailing byte after the safetensors data",
             lambda d: open(os.path.join(d, st1), "ab").write(b"\0"),
             [st1 + ": data ends at"])
        case("wrong global_offset in the flexfs metadata",
             lambda d: st_edit_meta(os.path.join(d, st1), lambda m: m["tensors"]["uneven.weight"]
                                    .__setitem__("global_offset", [0, 0])),
             [st1 + ": uneven.weight: flexfs metadata global_offset = [0, 0], expected [2, 0]"])
        case("flipped byte in hf/model.safetensors",
             lambda d: flip(os.path.join(d, "hf/model.safetensors"),
                            tensor_data_pos(os.path.join(d, "hf/model.safetensors"), "step_count")),
             ["hf/model.safetensors: step_count: data differs"])
        case("hf/config.json differs",
             lambda d: open(os.path.join(d, "hf/config.json"), "a").write(" "),
             ["hf/config.json: differs"])
        case("objects/extra.step.pt changed",
             lambda d: flip(os.path.join(d, "objects/extra.step.pt"), 100),
             ["objects/extra.step.pt: not the checkpoint's item bytes"])
        case("a whole rank directory missing",
             lambda d: shutil.rmtree(os.path.join(d, "ranks/tp01_pp00")),
             ["missing rank directory tp01_pp00"])
        case("no rules: block.weight cannot be inferred",
             lambda d: None, ["flexfs should have refused to mount: block.weight"], rules_arg=None)
        case("checked with the wrong --tp",
             lambda d: None, ["index.json: target tp/pp"], T=4)

        rc, out = R.run(os.path.join(work, "nonexistent"), truth, 2, 1, rules_path)
        R.expect("empty mount fails", rc, out, False, ["no tensor was checked"])

        # other shapes of correct trees, both torch versions
        for tag in ("dcp-t113", "dcp-t26"):
            fx = os.path.join(args.fixtures, tag)
            tr = os.path.join(fx, "truth")
            for (T, P, ren, shards) in ((2, 1, False, 0), (3, 2, True, 3), (4, 3, False, 2)):
                d = os.path.join(work, "%s-tp%d-pp%d" % (tag, T, P))
                build_tree(d, fx, T, P, rules, renumber=ren, hf_shards=shards)
                rc, out = R.run(d, tr, T, P, rules_path, ["--pp-renumber"] if ren else [])
                R.expect("%s tp=%d pp=%d%s%s: correct tree passes" % (
                    tag, T, P, " renumbered" if ren else "", " hf sharded" if shards else ""),
                    rc, out, True)
                if ren:
                    rc, out = R.run(d, tr, T, P, rules_path)
                    R.expect("%s renumbered tree checked without --pp-renumber fails" % tag,
                             rc, out, False, ["name = "])
                if shards:
                    edit_json(os.path.join(d, "hf/model.safetensors.index.json"),
                              lambda j: j["metadata"].__setitem__("total_size", 1))
                    rc, out = R.run(d, tr, T, P, rules_path, ["--pp-renumber"] if ren else [])
                    R.expect("%s wrong hf total_size fails" % tag, rc, out, False,
                             ["metadata.total_size 1"])
    finally:
        if args.keep:
            print("trees kept in %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("%d cases, %d failed" % (R.count, R.failures))
    return 1 if R.failures else 0


if __name__ == "__main__":
    sys.exit(main())
