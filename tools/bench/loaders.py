#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Real loaders of the flexfs benchmark's "loaders" figure, one per process.

    loaders.py --mode MODE --dir DIR [--tp N] [--advice none|seq|huge]
    loaders.py --mode MODE --file F [--file F ...]

DIR holds ranks/tpTT_pp00/ (a flexfs mount, the FUSE passthrough of plain
copies, or the plain copies themselves).  Every mode obtains every byte of
every rank's view and prints one JSON line: seconds (imports excluded),
bytes, mode.  --file names the safetensors files instead (an hf/ view, a
Hugging Face checkpoint; modes read, mmap, st_load, st_open).

  read      read() of model.safetensors, 1 MiB at a time, into one buffer
  mmap      mmap of model.safetensors, copied 1 MiB at a time into one
            buffer (the mmap data path alone)
  npy       np.load(mmap_mode='r') of tensors/*.npy, each copied into a
            fresh array
  st_load   safetensors.torch.load_file(), then a copy of every tensor (a
            loader that moves weights to a device)     [torch 2.6 chroot]
  st_open   safe_open(framework='pt') + get_tensor() of every key, copied
                                                        [torch 2.6 chroot]
  pt_mmap   torch.load(model.pt, mmap=True, weights_only=True), every
            tensor copied                               [torch 2.6 chroot]

--advice: madvise(MADV_SEQUENTIAL or MADV_HUGEPAGE) of the mapping before
the copy (mmap mode only; the loader-side lever).
"""

import argparse
import json
import mmap
import os
import sys
import time

MiB = 1 << 20


def rank_dirs(d, tp):
    return [os.path.join(d, "ranks", "tp%02d_pp00" % r) for r in range(tp)]


def st_files(dirs):
    return [os.path.join(d, "model.safetensors") for d in dirs]


def do_read(files, advice):
    buf = bytearray(MiB)
    mv = memoryview(buf)
    total = 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        while True:
            n = os.readv(fd, [mv])
            if n <= 0:
                break
            total += n
        os.close(fd)
    return total


def do_mmap(files, advice):
    buf = bytearray(MiB)
    total = 0
    for p in files:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            if advice == "seq":
                m.madvise(mmap.MADV_SEQUENTIAL)
            elif advice == "huge":
                m.madvise(mmap.MADV_HUGEPAGE)
            mv = memoryview(m)  # copied without a temporary object
            for off in range(0, size, MiB):
                n = min(MiB, size - off)
                buf[:n] = mv[off:off + n]
            total += size
            mv.release()
            m.close()
    return total


def do_npy(dirs, advice):
    import numpy as np
    total = 0
    keep = []
    for d in dirs:
        td = os.path.join(d, "tensors")
        for name in sorted(os.listdir(td)):
            a = np.load(os.path.join(td, name), mmap_mode="r")
            out = np.empty(a.shape, a.dtype)
            np.copyto(out, a)
            total += out.nbytes
            keep.append(out)
            del a
    return total


def copy_all(tensors, keep):
    n = 0
    for t in tensors:
        c = t.clone()
        n += c.numel() * c.element_size()
        keep.append(c)
    return n


def do_st_load(files, advice):
    from safetensors.torch import load_file
    keep, total = [], 0
    for p in files:
        sd = load_file(p)
        total += copy_all(sd.values(), keep)
        del sd
    return total


def do_st_open(files, advice):
    from safetensors import safe_open
    keep, total = [], 0
    for p in files:
        with safe_open(p, framework="pt") as f:
            total += copy_all((f.get_tensor(k) for k in f.keys()), keep)
    return total


def do_pt_mmap(dirs, advice):
    import torch
    keep, total = [], 0
    for d in dirs:
        sd = torch.load(os.path.join(d, "model.pt"), mmap=True, weights_only=True)
        total += copy_all(sd.values(), keep)
        del sd
    return total


MODES = dict(read=do_read, mmap=do_mmap, npy=do_npy, st_load=do_st_load,
             st_open=do_st_open, pt_mmap=do_pt_mmap)
TORCH_MODES = ("st_load", "st_open", "pt_mmap")
FILE_MODES = ("read", "mmap", "st_load", "st_open")  # take safetensors files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=sorted(MODES), required=True)
    ap.add_argument("--dir")
    ap.add_argument("--file", action="append", help="a safetensors file (repeatable)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--advice", choices=("none", "seq", "huge"), default="none")
    args = ap.parse_args(argv)
    if bool(args.dir) == bool(args.file) or (args.file and args.mode not in FILE_MODES):
        ap.error("one of --dir or --file (modes %s)" % ", ".join(FILE_MODES))
    if args.mode in TORCH_MODES:
        import torch  # noqa: F401  (imports are not timed)
        import safetensors.torch  # noqa: F401
    elif args.mode == "npy":
        import numpy  # noqa: F401
    if args.file:
        what = args.file
    else:
        dirs = rank_dirs(args.dir, args.tp)
        what = st_files(dirs) if args.mode in FILE_MODES else dirs
    t0 = time.monotonic()
    n = MODES[args.mode](what, args.advice)
    t1 = time.monotonic()
    print(json.dumps(dict(mode=args.mode, advice=args.advice, seconds=t1 - t0, bytes=n)))


if __name__ == "__main__":
    sys.exit(main())
