#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Re-write a DCP checkpoint as torch >= 2.7's ZStandard extension would
have written it (the benchmark's "zstd" figure, issue #21): every item one
zstd frame, level 3, through python-zstandard's stream writer (no content
size, no checksum: what the extension's transform_to makes), items back to
back in the same files, and each _StorageInfo given offset/length of its
frame and transform_descriptors = ['stream.zstd/1'] (the attribute torch
2.7 pickles; tools/fixtures/gen_zstd.py re-enacts the same write path
byte-exactly for the committed fixtures).

    zstd_ckpt.py SRC DST [--weights]   (Debian's /usr/bin/python3: torch 1.13, zstandard)

--weights: every tensor item's values replaced, before compression, by
N(0, 0.02) draws in the tensor's dtype (seeded by the item's key), saved
again by torch.save: the bench's data (uniform random bits) does not
compress at all, and zstd then stores raw blocks, decoded as fast as
memcpy; weights-like values compress about as real weights do and make
the decoder do entropy decoding.  The truth is then not the bench's.

Writes DST/.metadata, DST/*.distcp, DST/config.json, and last
DST/bench-ckpt.json (SRC's stamp plus "zstd": {...}: content and frame
bytes, seconds).
"""

import io
import json
import os
import pickle
import sys
import time

import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# scripts_dir() copies gen_dcp.py beside this script; from the repo, it is
# in tools/fixtures
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "fixtures"))
import gen_dcp  # noqa: E402  (torch 1.13 needs its dataclass shim)


def frame(data):
    buf = io.BytesIO()
    w = zstandard.ZstdCompressor(level=3).stream_writer(buf, closefd=False)
    w.write(data)
    w.close()
    return buf.getvalue()


def weights_like(item, key):
    import hashlib
    import torch
    t = torch.load(io.BytesIO(item))
    if not isinstance(t, torch.Tensor):
        return item
    g = torch.Generator().manual_seed(
        int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "little"))
    v = (torch.randn(t.shape, generator=g) * 0.02).to(t.dtype)
    buf = io.BytesIO()
    torch.save(v, buf)
    return buf.getvalue()


def main(src, dst, weights=False):
    t0 = time.monotonic()
    gen_dcp._install_dataclass_shim()
    with open(os.path.join(src, ".metadata"), "rb") as f:
        md = pickle.load(f)
    os.makedirs(dst, exist_ok=True)
    by_file = {}
    for k, si in md.storage_data.items():
        by_file.setdefault(si.relative_path, []).append((si.offset, k))
    content = frames = 0
    for rel, items in sorted(by_file.items()):
        items.sort(key=lambda x: x[0])
        with open(os.path.join(src, rel), "rb") as fi, \
                open(os.path.join(dst, rel), "wb") as fo:
            for _off, k in items:
                si = md.storage_data[k]
                fi.seek(si.offset)
                item = fi.read(si.length)
                if weights and k.offset is not None:
                    item = weights_like(item, k)
                z = frame(item)
                content += len(item)
                si.offset = fo.tell()
                si.length = len(z)
                si.transform_descriptors = ["stream.zstd/1"]
                fo.write(z)
                frames += len(z)
    with open(os.path.join(dst, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    for n in ("config.json",):
        if os.path.exists(os.path.join(src, n)):
            with open(os.path.join(src, n)) as fi, open(os.path.join(dst, n), "w") as fo:
                fo.write(fi.read())
    with open(os.path.join(src, "bench-ckpt.json")) as f:
        stamp = json.load(f)
    stamp["zstd"] = dict(content_bytes=content, frame_bytes=frames, level=3, weights=weights,
                         zstandard=zstandard.__version__,
                         seconds=time.monotonic() - t0)
    with open(os.path.join(dst, "bench-ckpt.json"), "w") as f:
        json.dump(stamp, f, indent=1)
    print("zstd_ckpt: %s: %.1f MiB of items in %.1f MiB of frames (%.2fx), %.1f s"
          % (dst, content / 2**20, frames / 2**20, content / max(frames, 1),
             time.monotonic() - t0))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--weights" in sys.argv[3:])
