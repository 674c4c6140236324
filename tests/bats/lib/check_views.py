#!/usr/bin/env python3
"""Oracle checker for a mounted flexfs tree, bit for bit against a truth dir.

The expected placement of every tensor (split axis, pipeline stages, target
names, per-rank boxes) is computed here, independently of flexfs, from the
truth manifest written by tools/fixtures/gen_dcp.py and the rules file;
index.json is only cross-checked against it.  Then every view file is parsed
with this script's own safetensors / npy readers (numpy only) and compared
with the truth .bin files:

  MNT/index.json                                 placements, cross-checked
  MNT/ranks/tpTT_ppPP/model.safetensors          all shards of that rank
  MNT/ranks/tpTT_ppPP/tensors/<target>.npy       one per shard (mmap-able)
  MNT/ranks/tpTT_ppPP/model.pt                   the same shards, torch.save zip
  MNT/hf/model.safetensors | model-*-of-*.safetensors + index
  MNT/hf/config.json, MNT/hf/tokenizer.json      byte-identical copies
  MNT/objects/<fqn>.pt                           BYTE_IO items verbatim

--real-safetensors also loads every .safetensors with the real `safetensors`
package (numpy framework, and framework="pt" when torch is importable).
torch, when importable, is also used to torch.load the objects/*.pt files.

model.pt is checked without torch first: Python's zipfile (names, order,
STORED, CRCs of the literal records), 64-byte data alignment, the pickle's
opcodes (protocol 2, what torch's weights-only unpickler accepts) and a
restricted unpickling whose tensor records are compared with the truth.
With torch it is also torch.load'ed (weights_only=True; and mmap=True from
torch 2.1), and with torch 1.x the file must be byte-identical to what
torch's own zip writer (torch._C.PyTorchFileWriter) writes for the same
records, but for the CRC-32 of the tensor records, which flexfs leaves 0
(torch.load does not check them; computing them would read every tensor).

Output: one line per problem, then "N passed, M failed" (checked files).
Exit status 0 only if nothing failed and at least one tensor was checked;
1 on failures; 2 on usage errors.  With --print-plan the expected plan is
printed as JSON (no mount needed); exit 0, or 3 if flexfs must refuse to
mount (e.g. a split that cannot be inferred and no rule).
"""

import argparse
import ast
import collections
import fnmatch
import hashlib
import io
import json
import os
import pickle
import pickletools
import re
import struct
import sys
import tempfile
import zipfile

import numpy as np

DEFAULT_LAYER_REGEX = r"(^|\.)layers\.([0-9]+)\."
DEFAULT_EMBED_REGEX = r"(^|\.)(tok_embeddings|embed_tokens|word_embeddings|wte)(\.|$)"

ST_DTYPE = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
    "bool": "BOOL", "uint16": "U16", "uint32": "U32", "uint64": "U64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64",
}
# Which dtypes the files of each format hold (docs/usage.md, "Dtypes older
# readers cannot hold"): safetensors those safetensors 0.4.5 parses, model.pt
# those torch 1.13 has a storage class for (PT_STORAGE below); with
# --new-dtypes (the mount's new_dtypes=1) also complex64 in safetensors and
# every dtype in model.pt.
ST_045 = set(ST_DTYPE) - {"complex64"}
NEW_DTYPES = False


def st_holds(dtype):
    return dtype in ST_DTYPE if NEW_DTYPES else dtype in ST_045


def pt_holds(dtype):
    return NEW_DTYPES or dtype in PT_STORAGE


ST_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
           "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
           "C64": 8}
NPY_DESCR = {
    "float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<u2",
    "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "|i1", "uint8": "|u1",
    "bool": "|b1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "float8_e4m3fn": "|u1", "float8_e5m2": "|u1", "complex64": "<c8",
}


class PlanError(Exception):
    pass


# ---------------------------------------------------------------------------
# Expected placement (independent of flexfs)


def load_rules(path):
    if not path:
        return []
    with open(path) as f:
        rules = json.load(f)
    if not isinstance(rules, list):
        raise SystemExit("check_views: %s: rules must be a JSON array" % path)
    for i, r in enumerate(rules):
        if not isinstance(r, dict) or "match" not in r or set(r) - {"match", "split", "stage", "note"}:
            raise SystemExit("check_views: %s: rule %d: bad keys %r" % (path, i, r))
    return rules


def file_name(name):
    """A tensor's or object's name as one file name (docs/usage.md: '/' and '%'
    percent-encoded, a leading '.' of "." or ".." too)."""
    lead = ""
    if name in (".", ".."):
        lead, name = "%2E", name[1:]
    return lead + name.replace("%", "%25").replace("/", "%2F")


def rank_dir(t, p):
    return "tp%02d_pp%02d" % (t, p)


def tp_box(shape, axis, t, T):
    """torch.chunk / DTensor box of TP rank t along axis (None: whole)."""
    off = [0] * len(shape)
    ext = list(shape)
    if axis is not None:
        n = shape[axis]
        c = -(-n // T)
        o = min(t * c, n)
        off[axis] = o
        ext[axis] = max(0, min((t + 1) * c, n) - o)
    return off, ext


def torch_chunks(n, parts):
    """[lo, hi) of torch.chunk(range(n), parts) pieces, empty ones included."""
    c = -(-n // parts)
    return [(min(k * c, n), min(k * c + c, n)) for k in range(parts)]


def fsdp_factor(offs, n, D):
    """m when the sorted distinct dim-0 offsets offs are FSDP's shards of
    degree D: torch.chunk(n, m) pieces (m > 1: TP's, under torch's strided
    shards) each cut in D torch.chunk pieces, empty ones never saved."""
    if n == 0:
        return 1
    for m in range(1, len(offs) + 1):
        want = [lo + a for lo, hi in torch_chunks(n, m)
                for a, b in torch_chunks(hi - lo, D) if b > a]
        if want == offs:
            return m
    return None


def fsdp_sharding(tensors):
    """-> (D, names): D >= 2 when every tensor of one or more dimensions
    (none stacked) was saved in FSDP's dim-0 shards of degree D; names:
    those whose dim 0 is split by that sharding alone (no TP split)."""
    offs = {f: sorted({c["offsets"][0] for c in e["chunks"]})
            for f, e in tensors.items() if e["shape"] and not e.get("stacked", 0)}
    for D in sorted({len(o) for o in offs.values() if len(o) > 1}):
        ms = {f: fsdp_factor(o, tensors[f]["shape"][0], D) for f, o in offs.items()}
        if all(m is not None for m in ms.values()):
            return D, {f for f, m in ms.items() if m == 1}
    return 0, set()


def expected_plan(manifest, T, P, rules, renumber=False,
                  layer_regex=DEFAULT_LAYER_REGEX, embed_regex=DEFAULT_EMBED_REGEX):
    """-> (plan, errors).  plan[fqn] = dict(dtype, shape, split_axis,
    stage_lo, stage_hi, layer, placement{rankdir: {name, offset, shape}}).
    errors: reasons flexfs must refuse to mount."""
    lre, ere = re.compile(layer_regex), re.compile(embed_regex)
    tensors = manifest["tensors"]
    errors = []
    layer_of, layer_span = {}, {}
    for fqn in tensors:
        m = lre.search(fqn)
        if m:
            g = lre.groups  # "the last group is the layer index"
            layer_of[fqn] = int(m.group(g))
            layer_span[fqn] = m.span(g)
    layers = sorted(set(layer_of.values()))
    base, extra = divmod(len(layers), P)
    stage_of_layer, first_layer = {}, {}
    pos = 0
    for s in range(P):
        cnt = base + (1 if s < extra else 0)
        grp = layers[pos:pos + cnt]
        pos += cnt
        if grp:
            first_layer[s] = grp[0]
        for lay in grp:
            stage_of_layer[lay] = s

    plan = {}
    _, dp_only = fsdp_sharding(tensors)
    for fqn, e in tensors.items():
        shape = list(e["shape"])
        rule = next((r for r in rules if fnmatch.fnmatchcase(fqn, r["match"])), None)
        # split axis
        if rule is not None and "split" in rule:
            axis = rule["split"]
            if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)
                                     or not 0 <= axis < len(shape)):
                errors.append("%s: rule %r names axis %r of a %d-d tensor"
                              % (fqn, rule["match"], axis, len(shape)))
                continue
        else:
            offs = [c["offsets"] for c in e["chunks"]]
            # leading axes that stack layers/experts are never TP-split
            # and FSDP's dim-0 shards are no TP split
            first = 1 if fqn in dp_only else e.get("stacked", 0)
            axes = [d for d in range(first, len(shape))
                    if len({o[d] for o in offs}) > 1]
            if len(axes) > 1 and T == 1:
                axes = []  # nothing is split at tp=1: served whole
            if len(axes) > 1:
                errors.append("%s: saved chunks differ along axes %s; the split cannot be "
                              "inferred and no rule gives it" % (fqn, axes))
                continue
            axis = axes[0] if axes else None
        # stages
        layer = layer_of.get(fqn)
        st = rule.get("stage") if rule is not None else None
        if st is not None:
            if st == "first":
                lo = hi = 0
            elif st == "last":
                lo = hi = P - 1
            elif st == "all":
                lo, hi = 0, P - 1
            elif isinstance(st, int) and not isinstance(st, bool) and 0 <= st < P:
                lo = hi = st
            else:
                errors.append("%s: rule %r: stage %r out of range for pp=%d"
                              % (fqn, rule["match"], st, P))
                continue
        elif e.get("stacked", 0) and e.get("layer_axis", True) and P > 1:
            # a stacked tensor: every stage, each its range of the layer axis
            lo, hi = 0, max(min(shape[0], P), 1) - 1
        elif layer is not None:
            lo = hi = stage_of_layer[layer]
        elif ere.search(fqn):
            lo = hi = 0
        else:
            lo = hi = P - 1
        names = {}
        for s in range(lo, hi + 1):
            name = fqn
            if renumber and layer is not None and s in first_layer:
                a, b = layer_span[fqn]
                name = fqn[:a] + str(layer - first_layer[s]) + fqn[b:]
            names[s] = name
        placement = {}
        for s in range(lo, hi + 1):
            for t in range(T):
                off, ext = tp_box(shape, axis, t, T)
                if e.get("stacked", 0) and e.get("layer_axis", True) and P > 1 \
                        and st is None:
                    q, r = divmod(shape[0], P)
                    off, ext = list(off), list(ext)
                    off[0], ext[0] = s * q + min(s, r), q + (1 if s < r else 0)
                placement[rank_dir(t, s)] = {"name": names[s], "offset": off, "shape": ext}
        plan[fqn] = {"dtype": e["dtype"], "shape": shape, "split_axis": axis,
                     "stage_lo": lo, "stage_hi": hi, "layer": layer, "placement": placement}
    # two tensors on one name in one stage
    seen = {}
    for fqn, pe in plan.items():
        for rd, pl in pe["placement"].items():
            k = (rd, pl["name"])
            if k in seen and seen[k] != fqn:
                errors.append("%s and %s both become %s on %s" % (seen[k], fqn, pl["name"], rd))
            seen[k] = fqn
    return plan, errors


# ---------------------------------------------------------------------------
# Reporting


class Report:
    def __init__(self, quiet=False):
        self.passed = 0
        self.failed = 0
        self.tensors_checked = 0
        self.quiet = quiet
        self.cur = None
        self.cur_bad = False

    def begin(self, path):
        self.cur = path
        self.cur_bad = False

    def bad(self, what, tensor=None):
        self.cur_bad = True
        loc = self.cur if tensor is None else "%s: %s" % (self.cur, tensor)
        print("FAIL %s: %s" % (loc, what))
        sys.stdout.flush()

    def end(self):
        if self.cur_bad:
            self.failed += 1
        else:
            self.passed += 1
            if not self.quiet:
                print("ok   %s" % self.cur)
        self.cur = None


class Truth:
    def __init__(self, truth_dir):
        self.dir = truth_dir
        with open(os.path.join(truth_dir, "manifest.json")) as f:
            self.manifest = json.load(f)
        self._cache = {}

    def array(self, fqn):
        a = self._cache.get(fqn)
        if a is None:
            e = self.manifest["tensors"][fqn]
            isz = e["itemsize"]
            with open(os.path.join(self.dir, e["file"]), "rb") as f:
                b = f.read()
            if len(b) != e["nbytes"] or hashlib.sha256(b).hexdigest() != e["sha256"]:
                raise SystemExit("check_views: truth file %s is damaged" % e["file"])
            dt = np.dtype("<u%d" % isz) if isz > 1 else np.dtype(np.uint8)
            a = np.frombuffer(b, dtype=dt).reshape(e["shape"])
            self._cache[fqn] = a
        return a

    def box_bytes(self, fqn, off, ext):
        a = self.array(fqn)
        sl = tuple(slice(o, o + n) for o, n in zip(off, ext))
        return np.ascontiguousarray(a[sl]).tobytes()


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def first_diff(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


# ---------------------------------------------------------------------------
# safetensors


def _no_dup_pairs(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate key %r" % k)
        d[k] = v
    return d


def parse_safetensors(data, rep):
    """Own parser. -> (meta or None, {name: (dtype, shape, begin, end)}, data_start)
    or None after reporting why not."""
    if len(data) < 8:
        rep.bad("file shorter than 8 bytes")
        return None
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > 100_000_000 or 8 + n > len(data):
        rep.bad("header length %d does not fit the file (%d bytes)" % (n, len(data)))
        return None
    hb = data[8:8 + n]
    if not hb.startswith(b"{"):
        rep.bad("header does not start with '{'")
        return None
    try:
        hdr = json.loads(hb.decode("utf-8"), object_pairs_hook=_no_dup_pairs)
    except ValueError as e:
        rep.bad("header is not valid UTF-8 JSON: %s" % e)
        return None
    if not isinstance(hdr, dict):
        rep.bad("header is not a JSON object")
        return None
    meta = hdr.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        rep.bad("__metadata__ is not a flat string->string map")
        meta = None
    ents = {}
    for name, e in hdr.items():
        ok = (isinstance(e, dict) and set(e) == {"dtype", "shape", "data_offsets"}
              and e["dtype"] in ST_SIZE and isinstance(e["shape"], list)
              and all(isinstance(s, int) and s >= 0 for s in e["shape"])
              and isinstance(e["data_offsets"], list) and len(e["data_offsets"]) == 2
              and all(isinstance(s, int) and s >= 0 for s in e["data_offsets"]))
        if not ok:
            rep.bad("malformed header entry %r" % (e,), name)
            continue
        ents[name] = (e["dtype"], e["shape"], e["data_offsets"][0], e["data_offsets"][1])
    # coverage: sorted by begin, contiguous from 0 to the end of the file
    pos = 0
    for name, (dt, shape, b, e) in sorted(ents.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if b != pos:
            rep.bad("data_offsets begin %d, expected %d (gap/overlap)" % (b, pos), name)
        if e - b != numel(shape) * ST_SIZE[dt]:
            rep.bad("data_offsets span %d bytes, %s%s needs %d"
                    % (e - b, dt, shape, numel(shape) * ST_SIZE[dt]), name)
        pos = max(pos, e)
    if 8 + n + pos != len(data):
        rep.bad("data ends at %d but the file has %d bytes" % (8 + n + pos, len(data)))
    return meta, ents, 8 + n


def read_all(path, rep):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        rep.bad("cannot read: %s" % e)
        return None
    if len(data) != size:
        rep.bad("read %d bytes but stat says %d" % (len(data), size))
    return data


def check_safetensors(path, want, truth, rep, flexfs_meta=None, real=False):
    """want: {name: (fqn, off, ext)}; flexfs_meta: expected decoded
    __metadata__["flexfs"] or None (then not required)."""
    data = read_all(path, rep)
    if data is None:
        return
    parsed = parse_safetensors(data, rep)
    if parsed is None:
        return
    meta, ents, start = parsed
    if meta is None or meta.get("format") != "pt":
        rep.bad('__metadata__ lacks "format": "pt" (got %r)' % (meta,))
    if flexfs_meta is not None:
        try:
            got = json.loads((meta or {}).get("flexfs", ""))
        except ValueError:
            got = None
        if got is None:
            rep.bad("__metadata__ has no valid flexfs JSON")
        else:
            for k in ("tp", "pp", "rank"):
                if got.get(k) != flexfs_meta[k]:
                    rep.bad("flexfs metadata %s = %r, expected %r" % (k, got.get(k), flexfs_meta[k]))
            gt = got.get("tensors") or {}
            for name in sorted(set(gt) - set(flexfs_meta["tensors"])):
                rep.bad("flexfs metadata lists an unexpected tensor", name)
            for name, ex in flexfs_meta["tensors"].items():
                g = gt.get(name)
                if g is None:
                    rep.bad("missing from the flexfs metadata", name)
                    continue
                for k, v in ex.items():
                    if g.get(k) != v:
                        rep.bad("flexfs metadata %s = %r, expected %r" % (k, g.get(k), v), name)
    for name in sorted(set(ents) - set(want)):
        rep.bad("unexpected tensor", name)
    for name, (fqn, off, ext) in sorted(want.items()):
        e = truth.manifest["tensors"][fqn]
        if name not in ents:
            rep.bad("missing tensor (source %s)" % fqn, name)
            continue
        dt, shape, b, en = ents[name]
        if dt != ST_DTYPE[e["dtype"]]:
            rep.bad("dtype %s, expected %s" % (dt, ST_DTYPE[e["dtype"]]), name)
        if shape != list(ext):
            rep.bad("shape %s, expected %s" % (shape, list(ext)), name)
        exp = truth.box_bytes(fqn, off, ext)
        got = data[start + b:start + en]
        if got != exp:
            if len(got) != len(exp):
                rep.bad("%d data bytes, expected %d" % (len(got), len(exp)), name)
            else:
                i = first_diff(got, exp)
                rep.bad("data differs from the truth at byte %d of the tensor "
                        "(file offset %d)" % (i, start + b + i), name)
        rep.tensors_checked += 1
    if real:
        check_real_safetensors(path, ents, want, truth, rep)


def _torch():
    try:
        import torch  # noqa: F401
        return torch
    except Exception:
        return None


def check_real_safetensors(path, ents, want, truth, rep):
    """Load with the real safetensors library (numpy; and pt if torch)."""
    try:
        import safetensors
        import safetensors.numpy as stnp
    except Exception as e:
        rep.bad("--real-safetensors: cannot import safetensors: %s" % e)
        return
    np_ok = {"F64", "F32", "F16", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8", "BOOL"}

    def cmp(name, arr_bytes, how):
        if name not in want:
            return
        fqn, off, ext = want[name]
        if arr_bytes != truth.box_bytes(fqn, off, ext):
            rep.bad("%s returns different bytes" % how, name)

    try:
        if all(ents[n][0] in np_ok for n in ents):
            got = stnp.load_file(path)
            if set(got) != set(ents):
                rep.bad("safetensors.numpy.load_file keys differ: %s" % sorted(set(got) ^ set(ents)))
            for name, a in got.items():
                cmp(name, np.ascontiguousarray(a).tobytes(), "safetensors.numpy.load_file")
        else:
            with safetensors.safe_open(path, framework="numpy") as f:
                for name in f.keys():
                    if ents.get(name, ("?",))[0] in np_ok:
                        cmp(name, np.ascontiguousarray(f.get_tensor(name)).tobytes(),
                            "safe_open(numpy)")
    except Exception as e:
        rep.bad("real safetensors (numpy) failed: %s: %s" % (type(e).__name__, e))
    torch = _torch()
    if torch is None:
        return
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    try:
        with safetensors.safe_open(path, framework="pt") as f:
            keys = set(f.keys())
            if keys != set(ents):
                rep.bad("safe_open(pt) keys differ: %s" % sorted(keys ^ set(ents)))
            for name in keys:
                t = f.get_tensor(name).contiguous()
                isz = t.element_size()
                v = t.reshape(-1)
                if v.dtype != ints[isz]:
                    v = v.view(ints[isz])
                cmp(name, v.numpy().tobytes(), "safe_open(framework='pt')")
                if name in want and list(t.shape) != list(want[name][2]):
                    rep.bad("safe_open(pt) shape %s" % list(t.shape), name)
    except Exception as e:
        rep.bad("real safetensors (pt) failed: %s: %s" % (type(e).__name__, e))


# ---------------------------------------------------------------------------
# npy


PT_STORAGE = {
    "float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage",
    "bfloat16": "BFloat16Storage", "int64": "LongStorage", "int32": "IntStorage",
    "int16": "ShortStorage", "int8": "CharStorage", "uint8": "ByteStorage",
    "bool": "BoolStorage", "complex64": "ComplexFloatStorage",
    "complex128": "ComplexDoubleStorage",
}
PT_OPCODES = {"PROTO", "GLOBAL", "MARK", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE",
              "REDUCE", "BINPERSID", "BINUNICODE", "BININT1", "BININT2", "BININT", "LONG1",
              "NEWFALSE", "SETITEMS", "STOP"}


def _pt_unpickle(pkl):
    """data.pkl -> [(name, storage class, key, numel, offset, size, stride, v3 dtype)],
    unpickled with a restricted table: only what a state dict of tensors needs."""

    def rebuild(storage, offset, size, stride, requires_grad, hooks, dtype=None):
        if requires_grad is not False or hooks != collections.OrderedDict():
            raise ValueError("requires_grad/hooks not False/empty")
        return ("T", storage, offset, tuple(size), tuple(stride), dtype)

    allowed = {("collections", "OrderedDict"): collections.OrderedDict,
               ("torch._utils", "_rebuild_tensor_v2"): rebuild,
               ("torch._utils", "_rebuild_tensor_v3"): rebuild,
               ("torch.storage", "UntypedStorage"): "UntypedStorage"}

    class U(pickle.Unpickler):
        def find_class(self, mod, name):
            if (mod, name) in allowed:
                return allowed[(mod, name)]
            if mod == "torch":
                return name  # a storage class or a dtype, checked below
            raise ValueError("global %s.%s" % (mod, name))

        def persistent_load(self, pid):
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                    and pid[3] == "cpu"):
                raise ValueError("persistent id %r" % (pid,))
            return pid

    sd = U(io.BytesIO(pkl)).load()
    if type(sd) is not collections.OrderedDict:
        raise ValueError("top level is %s, not an OrderedDict" % type(sd).__name__)
    out = []
    for name, v in sd.items():
        if not (isinstance(v, tuple) and v[0] == "T"):
            raise ValueError("%s: not a tensor" % name)
        _, pid, off, size, stride, dtype = v
        out.append((name, pid[1], pid[2], pid[4], off, size, stride, dtype))
    return out


def _pt_ref_bytes(torch, recs, data_names):
    """The zip torch's own writer makes of recs [(name, bytes)], tensor CRCs zeroed."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "archive")
        w = torch._C.PyTorchFileWriter(path)
        for name, b in recs:
            w.write_record(name, b, len(b))
        w.write_end_of_file()
        del w
        ref = bytearray(open(path, "rb").read())
        z = zipfile.ZipFile(path)
        pos = z.start_dir
        for _ in z.infolist():
            n, m, k = struct.unpack_from("<HHH", ref, pos + 28)
            name = ref[pos + 46:pos + 46 + n].decode()
            if name in data_names:
                lho, size = struct.unpack_from("<I", ref, pos + 42)[0], \
                    struct.unpack_from("<I", ref, pos + 24)[0]
                ref[pos + 16:pos + 20] = bytes(4)
                ln, le = struct.unpack_from("<HH", ref, lho + 26)
                if size:
                    ref[lho + 30 + ln + le + size + 4:lho + 30 + ln + le + size + 8] = bytes(4)
            pos += 46 + n + m + k
    return bytes(ref)


def check_model_pt(path, want, order, truth, rep):
    """want: name -> (fqn, off, ext); order: the names in flexfs's plan order as
    model.safetensors lists them (those it can hold)."""
    data = read_all(path, rep)
    if data is None:
        return
    try:
        z = zipfile.ZipFile(path)
        infos = z.infolist()
        pkl = z.read("archive/data.pkl")  # CRCs of the literal records checked here
        if z.read("archive/byteorder") != b"little" or z.read("archive/version") != b"3\n":
            rep.bad("byteorder/version records wrong")
        ents = _pt_unpickle(pkl)
        bad_ops = {op.name for op, _, _ in pickletools.genops(pkl)} - PT_OPCODES
        if bad_ops or pkl[:2] != b"\x80\x02":
            rep.bad("pickle not protocol 2 or opcodes outside torch's set: %s" % sorted(bad_ops))
    except Exception as err:
        rep.bad("not a torch.save zip: %s: %s" % (type(err).__name__, err))
        return
    names = [e[0] for e in ents]
    keys = ["archive/data/%d" % i for i in range(len(ents))]
    if [i.filename for i in infos] != ["archive/data.pkl", "archive/byteorder"] + keys + \
            ["archive/version"]:
        rep.bad("records %s" % [i.filename for i in infos])
        return
    if sorted(names) != sorted(want):
        rep.bad("keys %s, expected %s" % (sorted(names), sorted(want)))
        return
    if [n for n in names if n in order] != [n for n in order if n in names]:
        rep.bad("keys not in plan order: %s vs %s" % (names, order))
    raw = {}
    for i in infos:
        n, m = struct.unpack_from("<HH", data, i.header_offset + 26)
        doff = i.header_offset + 30 + n + m
        if i.compress_type != zipfile.ZIP_STORED or doff % 64:
            rep.bad("%s: not STORED at a multiple of 64 (%d)" % (i.filename, doff))
        raw[i.filename] = data[doff:doff + i.file_size]
    for k, (name, scls, key, nel, off, size, stride, dt) in enumerate(ents):
        fqn, o, ext = want[name]
        dtype = truth.manifest["tensors"][fqn]["dtype"]
        isz = truth.manifest["tensors"][fqn]["itemsize"]
        cont, acc = [], 1
        for s in reversed(ext):
            cont.insert(0, acc)
            acc *= max(s, 1)
        cls = PT_STORAGE.get(dtype, "UntypedStorage")
        want_nel = numel(ext) * (isz if cls == "UntypedStorage" else 1)
        if (scls, key, off, list(size), list(stride), dt) != \
                (cls, str(k), 0, list(ext), cont, None if dtype in PT_STORAGE else dtype) \
                or nel != want_nel:
            rep.bad("pickled as %r" % ((scls, key, nel, off, size, stride, dt),), name)
        if raw[keys[k]] != truth.box_bytes(fqn, o, ext):
            rep.bad("data/%d differs from the truth (source %s)" % (k, fqn), name)
        rep.tensors_checked += 1
    torch = _torch()
    if torch is None:
        return
    ver = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    # the dtypes without a storage class exist from torch 2.1 (uint16/32/64: 2.3)
    dts = {e[7] for e in ents}
    need = (2, 3) if dts & {"uint16", "uint32", "uint64"} else (2, 1) if dts - {None} else (1, 6)
    loads = [dict(weights_only=True)] if ver >= need else []
    if ver >= (2, 1) and ver >= need:
        loads.append(dict(weights_only=True, mmap=True))
    for kw in loads:
        try:
            sd = torch.load(path, **kw)
        except Exception as err:
            rep.bad("torch.load(%s) failed: %s: %s" % (kw, type(err).__name__, err))
            continue
        if list(sd) != names:
            rep.bad("torch.load(%s): keys %s" % (kw, list(sd)))
            continue
        for name, t in sd.items():
            fqn, o, ext = want[name]
            if str(t.dtype) != "torch." + truth.manifest["tensors"][fqn]["dtype"] or \
                    list(t.shape) != list(ext) or \
                    t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() != \
                    truth.box_bytes(fqn, o, ext):
                rep.bad("torch.load(%s) differs (%s %s)" % (kw, t.dtype, list(t.shape)), name)
        if kw.get("mmap"):
            continue
        # torch.save's own pickle of the same state dict says the same
        buf = io.BytesIO()
        torch.save(collections.OrderedDict((k, t.clone()) for k, t in sd.items()), buf)
        zr = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
        theirs = _pt_unpickle(zr.read([n for n in zr.namelist() if n.endswith("/data.pkl")][0]))
        if theirs != ents:
            rep.bad("data.pkl says %s, torch.save's pickle %s" % (ents, theirs))
    if ver[0] == 1 and hasattr(torch._C, "PyTorchFileWriter"):
        recs = [("data.pkl", pkl), ("byteorder", b"little")] + \
            [("data/%d" % k, raw[keys[k]]) for k in range(len(ents))]
        if _pt_ref_bytes(torch, recs, set(keys)) != data:
            rep.bad("not byte-identical to torch %s's zip writer" % torch.__version__)


def check_npy(path, fqn, off, ext, truth, rep):
    e = truth.manifest["tensors"][fqn]
    descr = NPY_DESCR[e["dtype"]]
    data = read_all(path, rep)
    if data is None:
        return
    if data[:6] != b"\x93NUMPY" or len(data) < 10:
        rep.bad("bad npy magic")
        return
    major = data[6]
    if major == 1:
        (hl,) = struct.unpack_from("<H", data, 8)
        start = 10 + hl
    elif major in (2, 3):
        (hl,) = struct.unpack_from("<I", data, 8)
        start = 12 + hl
    else:
        rep.bad("npy version %d.%d" % (major, data[7]))
        return
    htxt = data[start - hl:start]
    if start % 64:
        rep.bad("npy data starts at %d, not a multiple of 64" % start)
    if not htxt.endswith(b"\n"):
        rep.bad("npy header does not end with a newline")
    try:
        h = ast.literal_eval(htxt.decode("utf-8" if major == 3 else "latin1").strip())
    except (ValueError, SyntaxError) as err:
        rep.bad("npy header is not a Python literal: %s" % err)
        return
    if not isinstance(h, dict) or set(h) != {"descr", "fortran_order", "shape"}:
        rep.bad("npy header keys %r" % (sorted(h) if isinstance(h, dict) else h,))
        return
    if h["descr"] != descr:
        rep.bad("npy descr %r, expected %r" % (h["descr"], descr))
    if h["fortran_order"] is not False:
        rep.bad("npy fortran_order is %r" % h["fortran_order"])
    if list(h["shape"]) != list(ext):
        rep.bad("npy shape %s, expected %s" % (list(h["shape"]), list(ext)))
    exp = truth.box_bytes(fqn, off, ext)
    if len(data) != start + len(exp):
        rep.bad("npy file is %d bytes, expected %d" % (len(data), start + len(exp)))
    elif data[start:] != exp:
        rep.bad("npy data differs from the truth at byte %d" % first_diff(data[start:], exp))
    try:
        a = np.load(path, mmap_mode="r")
        if a.dtype.str != descr or list(a.shape) != list(ext):
            rep.bad("np.load gives %s %s" % (a.dtype.str, list(a.shape)))
        elif np.ascontiguousarray(a).tobytes() != exp:
            rep.bad("np.load(mmap_mode='r') data differs from the truth")
        del a
    except Exception as err:
        rep.bad("np.load(mmap_mode='r') failed: %s: %s" % (type(err).__name__, err))
    rep.tensors_checked += 1


# ---------------------------------------------------------------------------
# the mount


def check_index(mnt, plan, truth, T, P, rep):
    path = os.path.join(mnt, "index.json")
    rep.begin("index.json")
    try:
        with open(path) as f:
            idx = json.load(f)
    except (OSError, ValueError) as e:
        rep.bad("cannot load: %s" % e)
        rep.end()
        return
    tgt = idx.get("target") or {}
    if tgt.get("tp") != T or tgt.get("pp") != P:
        rep.bad("target tp/pp = %r/%r, expected %d/%d" % (tgt.get("tp"), tgt.get("pp"), T, P))
    if not isinstance(idx.get("source"), dict):
        rep.bad("no source object")
    it = idx.get("tensors") or {}
    for fqn in sorted(set(it) - set(truth.manifest["tensors"])):
        rep.bad("tensor not in the checkpoint", fqn)
    for fqn in truth.manifest["tensors"]:
        if fqn not in it:
            rep.bad("missing", fqn)
            continue
        if fqn not in plan:
            continue  # flexfs should have refused; reported elsewhere
        g, x = it[fqn], plan[fqn]
        for k in ("dtype", "shape", "split_axis", "stage_lo", "stage_hi", "layer"):
            if g.get(k) != x[k]:
                rep.bad("%s = %r, expected %r" % (k, g.get(k), x[k]), fqn)
        gp = g.get("placement") or {}
        for rd in sorted(set(gp) - set(x["placement"])):
            rep.bad("unexpected placement on %s" % rd, fqn)
        for rd, xp in sorted(x["placement"].items()):
            p = gp.get(rd)
            if p is None:
                rep.bad("no placement on %s" % rd, fqn)
                continue
            for k in ("name", "offset", "shape"):
                if p.get(k) != xp[k]:
                    rep.bad("placement %s %s = %r, expected %r" % (rd, k, p.get(k), xp[k]), fqn)
    io_ = idx.get("objects") or {}
    mo = truth.manifest.get("objects", {})
    for k in sorted(set(io_) - set(mo)):
        rep.bad("unexpected object", k)
    for k, e in mo.items():
        g = io_.get(k)
        if g is None:
            rep.bad("object missing", k)
            continue
        if g.get("path") != "objects/%s.pt" % file_name(k) or g.get("bytes") != e["length"]:
            rep.bad("object entry %r, expected path objects/%s.pt, bytes %d"
                    % (g, k, e["length"]), k)
    rep.end()


def check_ranks(mnt, plan, truth, T, P, rep, real):
    rdir = os.path.join(mnt, "ranks")
    want_dirs = {rank_dir(t, p) for t in range(T) for p in range(P)}
    rep.begin("ranks/")
    try:
        have = set(os.listdir(rdir))
    except OSError as e:
        rep.bad("cannot list: %s" % e)
        have = set()
    for d in sorted(have - want_dirs):
        rep.bad("unexpected entry %s" % d)
    for d in sorted(want_dirs - have):
        rep.bad("missing rank directory %s" % d)
    rep.end()
    for p in range(P):
        for t in range(T):
            rd = rank_dir(t, p)
            want, fmeta = {}, {}
            for fqn, x in plan.items():
                pl = x["placement"].get(rd)
                if pl is None:
                    continue
                want[pl["name"]] = (fqn, pl["offset"], pl["shape"])
                fmeta[pl["name"]] = {"source": fqn, "global_shape": x["shape"],
                                     "global_offset": pl["offset"], "split_axis": x["split_axis"]}
            dt = {n: truth.manifest["tensors"][w[0]]["dtype"] for n, w in want.items()}
            want_st = {n: w for n, w in want.items() if st_holds(dt[n])}
            rel = "ranks/%s/model.safetensors" % rd
            rep.begin(rel)
            check_safetensors(os.path.join(mnt, rel), want_st, truth, rep,
                              {"tp": T, "pp": P, "rank": {"tp": t, "pp": p},
                               "tensors": {n: m for n, m in fmeta.items() if n in want_st}},
                              real)
            rep.end()
            rel = "ranks/%s/model.pt" % rd
            rep.begin(rel)
            check_model_pt(os.path.join(mnt, rel),
                           {n: w for n, w in want.items() if pt_holds(dt[n])},
                           _st_names(mnt, rd), truth, rep)
            rep.end()
            tdir = os.path.join(mnt, "ranks", rd, "tensors")
            rep.begin("ranks/%s/tensors/" % rd)
            try:
                have = set(os.listdir(tdir))
            except OSError as e:
                rep.bad("cannot list: %s" % e)
                have = set()
            wantf = {n + ".npy" for n in want}
            for n in sorted(have - wantf):
                rep.bad("unexpected file %s" % n)
            rep.end()
            for name, (fqn, off, ext) in sorted(want.items()):
                rel = "ranks/%s/tensors/%s.npy" % (rd, file_name(name))
                rep.begin(rel)
                if name + ".npy" not in have:
                    rep.bad("missing (source %s)" % fqn)
                else:
                    check_npy(os.path.join(mnt, rel), fqn, off, ext, truth, rep)
                rep.end()


def _st_names(mnt, rd):
    """The tensors of the rank's model.safetensors "flexfs" metadata, in its order."""
    try:
        with open(os.path.join(mnt, "ranks", rd, "model.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
        return list(json.loads(h["__metadata__"]["flexfs"])["tensors"])
    except Exception:
        return []


_SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")


def check_hf(mnt, truth, rep, real):
    hf = os.path.join(mnt, "hf")
    tens = {k: e for k, e in truth.manifest["tensors"].items() if st_holds(e["dtype"])}
    full = {fqn: (fqn, [0] * len(e["shape"]), e["shape"]) for fqn, e in tens.items()}
    ipath = os.path.join(hf, "model.safetensors.index.json")
    if os.path.exists(ipath):
        rep.begin("hf/model.safetensors.index.json")
        files = {}
        try:
            with open(ipath) as f:
                idx = json.load(f)
            wm = idx["weight_map"]
            total = idx["metadata"]["total_size"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            rep.bad("cannot use the index: %s" % e)
            wm, total = {}, None
        want_total = sum(e["nbytes"] for e in tens.values())
        if total is not None and total != want_total:
            rep.bad("metadata.total_size %r, expected %d" % (total, want_total))
        for k in sorted(set(wm) - set(tens)):
            rep.bad("weight_map lists an unknown tensor", k)
        for k in tens:
            if k not in wm:
                rep.bad("weight_map lacks the tensor", k)
        for k, fn in wm.items():
            files.setdefault(fn, {})
            if k in full:
                files[fn][k] = full[k]
        nums = []
        for fn in files:
            m = _SHARD_RE.match(fn)
            if not m:
                rep.bad("shard name %r is not model-0000i-of-0000N.safetensors" % fn)
            else:
                nums.append((int(m.group(1)), int(m.group(2))))
            if not os.path.exists(os.path.join(hf, fn)):
                rep.bad("listed file %s does not exist" % fn)
        if nums:
            n = nums[0][1]
            if any(b != n for _, b in nums) or sorted(a for a, _ in nums) != list(range(1, n + 1)):
                rep.bad("shard numbering %s is not 1..%d of %d" % (sorted(nums), n, n))
        rep.end()
        for fn, want in sorted(files.items()):
            rep.begin("hf/" + fn)
            check_safetensors(os.path.join(hf, fn), want, truth, rep, None, real)
            rep.end()
    else:
        rep.begin("hf/model.safetensors")
        check_safetensors(os.path.join(hf, "model.safetensors"), full, truth, rep, None, real)
        rep.end()
    for name, e in sorted(truth.manifest.get("aux_files", {}).items()):
        rep.begin("hf/" + name)
        data = read_all(os.path.join(hf, name), rep)
        if data is not None and (len(data) != e["bytes"]
                                 or hashlib.sha256(data).hexdigest() != e["sha256"]):
            rep.bad("differs from the checkpoint's %s" % name)
        rep.end()


def check_objects(mnt, truth, rep):
    torch = _torch()
    for fqn, e in truth.manifest.get("objects", {}).items():
        rel = "objects/%s.pt" % file_name(fqn)
        rep.begin(rel)
        path = os.path.join(mnt, rel)
        data = read_all(path, rep)
        if data is not None:
            if len(data) != e["length"] or hashlib.sha256(data).hexdigest() != e["sha256"]:
                rep.bad("not the checkpoint's item bytes (%d bytes, expected %d)"
                        % (len(data), e["length"]))
            elif torch is not None and "json" in e:
                try:
                    try:
                        v = torch.load(path, weights_only=True)
                    except Exception:
                        # old weights_only unpicklers lack opcodes (1.13: BINFLOAT);
                        # the bytes were just verified to be the fixture's own item
                        v = torch.load(path, weights_only=False)
                    if v != e["json"]:
                        rep.bad("torch.load gives %r, expected %s" % (v, e["repr"]))
                except Exception as err:
                    rep.bad("torch.load failed: %s: %s" % (type(err).__name__, err))
        rep.end()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--mount", help="the flexfs mount point (or a tree laid out like one)")
    ap.add_argument("--truth", required=True, help="truth dir (manifest.json + *.bin)")
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--rules", help="the rules JSON the mount used")
    ap.add_argument("--pp-renumber", action="store_true", help="mounted with pp_renumber")
    ap.add_argument("--layer-regex", default=DEFAULT_LAYER_REGEX)
    ap.add_argument("--embed-regex", default=DEFAULT_EMBED_REGEX)
    ap.add_argument("--new-dtypes", action="store_true",
                    help="mounted with new_dtypes=1")
    ap.add_argument("--real-safetensors", action="store_true",
                    help="also load with the real safetensors package")
    ap.add_argument("--print-plan", action="store_true",
                    help="print the expected plan as JSON and exit (no --mount needed)")
    ap.add_argument("-q", "--quiet", action="store_true", help="do not list passing files")
    args = ap.parse_args(argv)
    if args.tp < 1 or args.pp < 1:
        ap.error("--tp and --pp must be >= 1")
    if not args.print_plan and not args.mount:
        ap.error("--mount is required")

    global NEW_DTYPES
    NEW_DTYPES = args.new_dtypes
    truth = Truth(args.truth)
    rules = load_rules(args.rules)
    plan, errors = expected_plan(truth.manifest, args.tp, args.pp, rules, args.pp_renumber,
                                 args.layer_regex, args.embed_regex)
    if args.print_plan:
        json.dump({"tensors": plan, "refuse": errors}, sys.stdout, indent=1)
        print()
        return 3 if errors else 0

    rep = Report(args.quiet)
    if errors:
        rep.begin("(mount)")
        for e in errors:
            rep.bad("flexfs should have refused to mount: " + e)
        rep.end()
    check_index(args.mount, plan, truth, args.tp, args.pp, rep)
    check_ranks(args.mount, plan, truth, args.tp, args.pp, rep, args.real_safetensors)
    check_hf(args.mount, truth, rep, args.real_safetensors)
    check_objects(args.mount, truth, rep)
    print("%d passed, %d failed" % (rep.passed, rep.failed))
    if rep.tensors_checked == 0:
        print("FAIL: no tensor was checked")
        return 1
    return 0 if rep.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
