#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Readers and byte checks of the flexfs benchmark (numpy only).

As a module: seq_read() (the 1 MiB sequential reader every throughput
figure uses, for flexfs files and backing files alike), the safetensors
parser and the checks against the regenerated ground truth (model.py).

As a script, the flexfs side of the end-to-end figure: obtain every tensor
of every target rank of a mounted TP-N layout, in a fresh process:

    readers.py e2e --mnt MNT --info CKPT/bench-ckpt.json --tp 4
                   --mode npy|st [--check none|sample|all]

  npy: np.load(mmap_mode='r') of ranks/*/tensors/*.npy, copied into a
       fresh array (every byte touched);
  st:  ranks/*/model.safetensors parsed by hand, each tensor read() into
       a fresh array.
Prints one JSON line: t0/t1 (CLOCK_MONOTONIC, comparable across
processes), seconds, bytes delivered, tensors, and the check result.
"""

import argparse
import json
import os
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

MiB = 1 << 20

ST_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
             "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
             "U8": np.uint8, "BOOL": np.uint8}


def seq_read(paths, bs=MiB, ranges=None):
    """Read every file (or each (path, off, len) of ranges) front to back
    with bs-sized read()s into one reused buffer.  -> (bytes, seconds)."""
    buf = bytearray(bs)
    mv = memoryview(buf)
    total = 0
    items = ranges if ranges is not None else [(p, 0, None) for p in paths]
    t0 = time.perf_counter()
    for p, off, ln in items:
        fd = os.open(p, os.O_RDONLY)
        try:
            if off:
                os.lseek(fd, off, os.SEEK_SET)
            left = ln
            while True:
                want = bs if left is None else min(bs, left)
                if want == 0:
                    break
                n = os.readv(fd, [mv[:want]])
                if n <= 0:
                    break
                total += n
                if left is not None:
                    left -= n
        finally:
            os.close(fd)
    return total, time.perf_counter() - t0


# ---------------------------------------------------------------------------
# safetensors


def st_header(f):
    """-> (header dict without __metadata__, metadata, data start)."""
    f.seek(0)
    (n,) = struct.unpack("<Q", f.read(8))
    hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", None)
    return hdr, meta, 8 + n


def st_read_all(path):
    """Every tensor of a safetensors file, read() into fresh arrays
    (bf16 as uint16).  -> {name: array}."""
    out = {}
    with open(path, "rb", buffering=0) as f:
        hdr, _meta, base = st_header(f)
        for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            b, en = e["data_offsets"]
            a = np.empty(e["shape"], dtype=ST_DTYPES[e["dtype"]])
            mv = memoryview(a.reshape(-1).view(np.uint8))
            f.seek(base + b)
            got = 0
            while got < en - b:
                n = f.readinto(mv[got:])
                if not n:
                    raise IOError("%s: short read in %s" % (path, name))
                got += n
            out[name] = a
    return out


# ---------------------------------------------------------------------------
# ground truth


class Truth:
    """Regenerated tensors of a checkpoint (bench-ckpt.json), one cached."""

    def __init__(self, info):
        self.info = info
        self.seed = info["seed"]
        self.spec = self._spec(info)  # fqn -> (shape given to _data, split axis)
        self._last = (None, None)

    def _spec(self, info):
        return {f: (s, a) for f, s, a in model.tensors(info["config"], info.get("tensors_limit"))}

    def _data(self, fqn):
        return model.data(fqn, self.spec[fqn][0], self.seed)

    def shape(self, fqn):
        return self.spec[fqn][0]

    def full(self, fqn):
        if self._last[0] != fqn:
            self._last = (fqn, self._data(fqn))
        return self._last[1]

    def shard(self, fqn, tp, r):
        offs, sizes = model.target_box(self.shape(fqn), self.spec[fqn][1], tp, r)
        return self.full(fqn)[model.box_slice(offs, sizes)]


class TransposedTruth(Truth):
    """Ground truth of the transposed checkpoint (model.transposed_config):
    each tensor is base.T; the TP shards of split tensors follow their saved
    split, whole tensors are replicated."""

    def _spec(self, info):
        return {f: (tuple(b), a) for f, b, a in info["config"]["tensors"]}

    def _data(self, fqn):
        return model.transposed_data(fqn, self.spec[fqn][0], self.seed)

    def shape(self, fqn):
        return tuple(reversed(self.spec[fqn][0]))


def truth_for(info):
    if info["config"].get("kind") == "transposed":
        return TransposedTruth(info)
    return Truth(info)


def sample_names(names):
    """The tensors checked when not checking all: embeddings, output,
    norms, every tensor of the first and last layer."""
    layers = sorted({int(n.split(".")[1]) for n in names if n.startswith("layers.")})
    keep = {"layers.%d." % layers[0], "layers.%d." % layers[-1]} if layers else set()
    return [n for n in names if not n.startswith("layers.") or
            any(n.startswith(k) for k in keep)]


def compare(got, want, what, errors):
    if got.shape != want.shape:
        errors.append("%s: shape %s, want %s" % (what, got.shape, want.shape))
        return
    g = np.ascontiguousarray(got).view(np.uint16) if got.dtype.itemsize == 2 else got
    if not np.array_equal(g, want):
        bad = np.flatnonzero(g.reshape(-1) != want.reshape(-1))
        errors.append("%s: %d of %d elements differ (first at flat index %d)"
                      % (what, bad.size, want.size, bad[0]))


def check_rank_tensors(truth, got_by_rank, tp, mode):
    """got_by_rank[r] = {fqn: array}; compares names (always) and bytes
    (mode all|sample) with the ground truth.  -> result dict."""
    errors, checked, nbytes = [], 0, 0
    want_names = sorted(truth.spec)
    for r in range(tp):
        names = sorted(got_by_rank[r])
        if names != want_names:
            errors.append("rank %d: tensor set differs (%d names, want %d)"
                          % (r, len(names), len(want_names)))
    if mode != "none":
        names = want_names if mode == "all" else sample_names(want_names)
        for fqn in names:  # fqn outer: one regeneration per tensor
            for r in range(tp):
                if fqn in got_by_rank[r]:
                    compare(got_by_rank[r][fqn], truth.shard(fqn, tp, r),
                            "rank %d %s" % (r, fqn), errors)
                    checked += 1
                    nbytes += got_by_rank[r][fqn].nbytes
    return dict(mode=mode, tensors_checked=checked, bytes_checked=nbytes,
                errors=errors[:20], n_errors=len(errors), ok=not errors)


def check_st_files(truth, files, expect, mode="all"):
    """Check safetensors view files: expect(name) -> ground-truth array for
    a tensor name found in them.  -> result dict."""
    errors, checked, nbytes, seen = [], 0, 0, set()
    for p in files:
        got = st_read_all(p)
        with open(p, "rb") as f:
            _h, meta, _b = st_header(f)
        if not meta or meta.get("format") != "pt":
            errors.append("%s: __metadata__ format is not 'pt'" % p)
        names = sorted(got)
        if mode == "sample":
            names = sample_names(names)
        for n in names:
            compare(got[n], expect(n), "%s:%s" % (os.path.basename(p), n), errors)
            checked += 1
            nbytes += got[n].nbytes
        seen.update(got)
        del got
    return dict(mode=mode, files=len(files), tensors_checked=checked, bytes_checked=nbytes,
                names=len(seen), errors=errors[:20], n_errors=len(errors), ok=not errors)


# ---------------------------------------------------------------------------
# end-to-end reader (a fresh process per run)


def floor(info, tp, src_files):
    """The floor of any reader on this machine: the same TP-tp arrays,
    freshly allocated, filled by read() from plain page-cached files (the
    backing .distcp, whatever their bytes) -- allocation + one copy."""
    got, total, per_rank = [], 0, []
    fds = [os.open(p, os.O_RDONLY) for p in src_files]
    fi, pos = 0, 0
    t0 = time.monotonic()
    for r in range(tp):
        tr = time.monotonic()
        sd = {}
        for fqn, shape, axis in model.tensors(info["config"], info.get("tensors_limit")):
            _o, sizes = model.target_box(shape, axis, tp, r)
            a = np.empty(sizes, np.uint16)
            mv = memoryview(a.reshape(-1).view(np.uint8))
            got_b = 0
            while got_b < len(mv):
                n = os.preadv(fds[fi], [mv[got_b:]], pos)
                if n <= 0:
                    fi, pos = (fi + 1) % len(fds), 0
                    continue
                got_b += n
                pos += n
            sd[fqn] = a
        total += sum(a.nbytes for a in sd.values())
        got.append(sd)
        per_rank.append(time.monotonic() - tr)
    t1 = time.monotonic()
    for fd in fds:
        os.close(fd)
    return got, dict(t0=t0, t1=t1, seconds=t1 - t0, bytes=total, per_rank=per_rank,
                     mode="floor")


def e2e(mnt, tp, mode, pp=1):
    got = []
    t0 = time.monotonic()
    total = ntens = 0
    per_rank = []
    for r in range(tp):
        tr = time.monotonic()
        d = os.path.join(mnt, "ranks", "tp%02d_pp%02d" % (r, 0))
        sd = {}
        if mode == "npy":
            td = os.path.join(d, "tensors")
            for name in os.listdir(td):
                a = np.load(os.path.join(td, name), mmap_mode="r")
                out = np.empty(a.shape, a.dtype)
                np.copyto(out, a)
                del a
                sd[name[:-4]] = out
        else:
            sd = st_read_all(os.path.join(d, "model.safetensors"))
        total += sum(a.nbytes for a in sd.values())
        ntens += len(sd)
        got.append(sd)
        per_rank.append(time.monotonic() - tr)
    t1 = time.monotonic()
    return got, dict(t0=t0, t1=t1, seconds=t1 - t0, bytes=total, tensors=ntens,
                     per_rank=per_rank, mode=mode)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("e2e")
    e.add_argument("--mnt", help="the mount (npy, st)")
    e.add_argument("--info", required=True, help="the checkpoint's bench-ckpt.json")
    e.add_argument("--tp", type=int, required=True)
    e.add_argument("--mode", choices=("npy", "st", "floor"), required=True)
    e.add_argument("--src", nargs="*", help="floor: the plain files to read from")
    e.add_argument("--check", choices=("none", "sample", "all"), default="none")
    args = ap.parse_args(argv)
    with open(args.info) as f:
        info = json.load(f)
    if args.mode == "floor":
        got, res = floor(info, args.tp, args.src)
        res["check"] = dict(mode="none", ok=True)
    else:
        got, res = e2e(args.mnt, args.tp, args.mode)
        res["check"] = check_rank_tensors(Truth(info), got, args.tp, args.check)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
