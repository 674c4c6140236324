#!/usr/bin/env python3
"""Start and observe -o push_ahead_kb pushes (fs/fuse_ll.c) on a mount.

    push_probe.py --skip-kb K FILE...

For every file (a view's model.safetensors or a .npy), one byte is read at
the start of each tensor's bytes (safetensors: the data offsets of its
header; .npy: offset 0), the first read that lands in that tensor.  The
daemon then pushes the rest of the tensor past K KiB (the mount's
readahead) into the page cache.  This waits (up to 10 s) until some page
of each tensor that neither that read nor its readahead asked for is
cached (mincore(2) of a mapping, which faults nothing in), and prints
"pushed N of M tensors"; exit status 1 when none was pushed.  The bytes
themselves are then checked by lib/check_views.py against the truth.
"""

import argparse
import ctypes
import json
import mmap
import os
import struct
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def tensor_ranges(path):
    """[(start, end)] of each tensor's bytes in the file."""
    with open(path, "rb") as f:
        if path.endswith(".npy"):
            return [(0, os.fstat(f.fileno()).st_size)]
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    return [(8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
            for k, v in hdr.items() if k != "__metadata__"]


def resident(fd, size):
    """mincore() vector of the file's pages."""
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    try:
        vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
        if libc.mincore(addr, size, vec):
            raise OSError(ctypes.get_errno(), "mincore")
        return vec.raw
    finally:
        libc.munmap(addr, size)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-kb", type=int, required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    # pages of a tensor past what the first read (one request of at most
    # the readahead, rounded to pages) could have cached
    margin = 2 + (a.skip_kb * 1024 + PAGE - 1) // PAGE * 2
    todo = []
    for path in a.files:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        for b, e in tensor_ranges(path):
            # the last page may be the next tensor's first, read below
            first = b // PAGE + margin
            last = e // PAGE - 2
            if first <= last:
                os.pread(fd, 1, b)
                todo.append((fd, size, first, last))
    pushed = set()
    deadline = time.monotonic() + 10
    while len(pushed) < len(todo) and time.monotonic() < deadline:
        for i, (fd, size, first, last) in enumerate(todo):
            if i not in pushed and any(c & 1 for c in resident(fd, size)[first:last + 1]):
                pushed.add(i)
        time.sleep(0.05)
    print("pushed %d of %d tensors" % (len(pushed), len(todo)))
    return 0 if pushed else 1


if __name__ == "__main__":
    sys.exit(main())
