#!/usr/bin/env python3
"""Compare a mount's paddle/ directory with the per-rank files that
tools/fixtures/gen_paddle.py pdparams wrote for the same target (its
paddle.save stand-in: the oracle).

Usage: check_paddle_files.py MOUNT/paddle EXPECTED_DIR

The directory must hold exactly the files of EXPECTED_DIR/expected.json.
Each is read whole (its size must be st_size) and loaded with pickle.load
(encoding='latin1', as paddle.load does), and must equal the expected
file's pickle.load: the same dicts with the same keys in the same order,
the same Paddle names, (name, ndarray) tuples where paddle.save writes
them, and every ndarray of the same numpy dtype and shape with the same
bytes (bf16 as uint16 bits).  The mount's files are also loaded strictly:
protocol 4, well formed to pickletools, nothing after STOP, and no global
but the four paddle.save writes.  Prints "N files equal" or the first
difference (exit 1).  /usr/bin/python3 (numpy)."""

import io
import json
import os
import pickle
import pickletools
import sys

import numpy as np


class Differ(Exception):
    pass


def same(a, b, where):
    if type(a) is not type(b):
        raise Differ(f"{where}: {type(a).__name__} != {type(b).__name__}")
    if isinstance(a, dict):
        if list(a) != list(b):
            raise Differ(f"{where}: keys {list(a)} != {list(b)}")
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        if len(a) != len(b):
            raise Differ(f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        if a.dtype.str != b.dtype.str or a.shape != b.shape:
            raise Differ(f"{where}: {a.dtype.str}{a.shape} != {b.dtype.str}{b.shape}")
        if not a.flags.c_contiguous or a.tobytes() != b.tobytes():
            raise Differ(f"{where}: bytes differ")
    elif a != b:
        raise Differ(f"{where}: {a!r} != {b!r}")


# The only globals a paddle.save pickle of arrays names (docs/formats/paddle.md#paddlenlp-per-rank-files): numpy 1.x and 2.x both import numpy.core.multiarray._reconstruct
# (numpy._core.* would fail on numpy 1.x); builtins.tuple for the
# (name, ndarray) form.
ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
           ("numpy", "dtype"), ("builtins", "tuple")}


class Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise Differ(f"global {module}.{name} is not one paddle.save writes")
        return super().find_class(module, name)


def load(path, strict=False):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != os.stat(path).st_size:
        raise Differ(f"{path}: read {len(data)} bytes, st_size {os.stat(path).st_size}")
    if not strict:
        return pickle.loads(data, encoding="latin1")
    # the mount's file: protocol 4, well formed (pickletools checks the
    # stack and the marks: empty at STOP), nothing after STOP, and only
    # the globals above
    if data[:2] != b"\x80\x04":
        raise Differ(f"{path}: not PROTO 4")
    try:
        pickletools.dis(data, out=io.StringIO())
    except ValueError as e:
        raise Differ(f"{path}: malformed pickle: {e}")
    f = io.BytesIO(data)
    obj = Restricted(f, encoding="latin1").load()
    if f.tell() != len(data):
        raise Differ(f"{path}: {len(data) - f.tell()} bytes after STOP")
    return obj


def main():
    mnt, exp_dir = sys.argv[1], sys.argv[2]
    with open(os.path.join(exp_dir, "expected.json")) as f:
        files = json.load(f)["files"]
    try:
        got = sorted(os.listdir(mnt))
        if got != sorted(files):
            raise Differ(f"{mnt}: files {got} != {sorted(files)}")
        for name in files:
            same(load(os.path.join(mnt, name), True),
                 load(os.path.join(exp_dir, name)), name)
    except Differ as e:
        print(f"FAIL: {e}")
        sys.exit(1)
    print(f"{len(files)} files equal")


if __name__ == "__main__":
    main()
