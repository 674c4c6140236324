#!/usr/bin/env python3
"""A model.pt past 4 GiB (ZIP64 records), against torch's own zip writer.

make SRC: write SRC/model.safetensors, a sparse file: "big", a uint8
tensor of BIG bytes (zeros), then "small", 4 float32 values; a ZIP64 size
for data/0 and a ZIP64 offset for data/1 and version.

check PT [--ref]: Python's zipfile reads the central directory (it decodes
the ZIP64 extra fields and checks them against the 0xFFFFFFFF markers);
every record is STORED at a multiple of 64; "small" is right; torch.load
(weights_only, and mmap from torch 2.1) gives both tensors; with --ref and
torch 1.x the file equals, chunk by chunk, what torch._C.PyTorchFileWriter
writes for the same records, but for the CRC of the tensor records.
Exit 0 on success, 1 with a message otherwise.
"""

import json
import os
import struct
import sys
import tempfile
import zipfile

BIG = (1 << 32) + 100
SMALL = struct.pack("<4f", 1.5, -2.0, 3.25, 1e-3)
CHUNK = 1 << 26


def make(src):
    os.makedirs(src, exist_ok=True)
    hdr = {"big": {"dtype": "U8", "shape": [BIG], "data_offsets": [0, BIG]},
           "small": {"dtype": "F32", "shape": [4], "data_offsets": [BIG, BIG + 16]}}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((-(8 + len(h))) % 8)
    with open(os.path.join(src, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.seek(8 + len(h) + BIG)
        f.write(SMALL)


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def records(path):
    z = zipfile.ZipFile(path)
    out = []
    with open(path, "rb") as f:
        for i in z.infolist():
            f.seek(i.header_offset)
            lfh = f.read(30)
            n, m = struct.unpack_from("<HH", lfh, 26)
            out.append((i.filename, i.header_offset, i.header_offset + 30 + n + m,
                        i.file_size, i.compress_type, i.CRC))
    return z, out


def ref_file(torch, path, recs, d):
    """torch's writer on the same records (data read back from path)."""
    ref = os.path.join(d, "archive")
    w = torch._C.PyTorchFileWriter(ref)
    with open(path, "rb") as f:
        for name, _, doff, size, _, _ in recs:
            if name == "archive/version":
                continue
            if size > CHUNK:  # the zeros of "big": a buffer torch reads
                buf = torch.zeros(size, dtype=torch.uint8)
                w.write_record(name[len("archive/"):], buf.data_ptr(), size)
                del buf
                continue
            f.seek(doff)
            b = f.read(size)
            w.write_record(name[len("archive/"):], b, size)
    w.write_end_of_file()
    del w
    return ref


def tensor_crc_fields(path, recs):
    """File offsets of the CRC fields of the tensor records (descriptor, CD)."""
    z = zipfile.ZipFile(path)
    pos, out = z.start_dir, []
    with open(path, "rb") as f:
        f.seek(pos)
        cd = f.read()
    p = 0
    for name, _, doff, size, _, _ in recs:
        n, m, k = struct.unpack_from("<HHH", cd, p + 28)
        if name.startswith("archive/data/"):
            out.append(pos + p + 16)
            if size:
                out.append(doff + size + 4)
        p += 46 + n + m + k
    return out


def check(path, ref):
    size = os.path.getsize(path)
    z, recs = records(path)
    names = [r[0] for r in recs]
    if names != ["archive/data.pkl", "archive/byteorder", "archive/data/0", "archive/data/1",
                 "archive/version"]:
        fail("records %s" % names)
    for name, h, doff, n, ct, _ in recs:
        if ct != zipfile.ZIP_STORED or doff % 64:
            fail("%s not STORED at a multiple of 64 (%d)" % (name, doff))
    if recs[2][3] != BIG or recs[3][1] < 1 << 32:
        fail("not a ZIP64 archive: %s" % recs)
    z.read("archive/data.pkl")
    if z.read("archive/version") != b"3\n":
        fail("version")
    with open(path, "rb") as f:
        f.seek(recs[3][2])
        if f.read(16) != SMALL:
            fail("data/1 is not small's bytes")
    try:
        import torch
    except ImportError:
        print("ok (no torch)")
        return
    ver = tuple(int(x) for x in torch.__version__.split(".")[:2])
    for kw in [dict(weights_only=True)] + ([dict(weights_only=True, mmap=True)]
                                          if ver >= (2, 1) else []):
        sd = torch.load(path, **kw)
        if list(sd) != ["big", "small"] or sd["big"].shape != (BIG,) or \
                sd["big"][-7:].tolist() != [0] * 7 or \
                sd["small"].numpy().tobytes() != SMALL:
            fail("torch.load(%s) gives the wrong state dict" % kw)
        del sd
    if ref and ver[0] == 1:
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as d:
            rp = ref_file(torch, path, recs, d)
            if os.path.getsize(rp) != size:
                fail("%d bytes, torch's writer %d" % (size, os.path.getsize(rp)))
            skip = set()
            for o in tensor_crc_fields(rp, records(rp)[1]):
                skip.update(range(o, o + 4))
            with open(path, "rb") as a, open(rp, "rb") as b:
                off = 0
                while off < size:
                    x, y = bytearray(a.read(CHUNK)), bytearray(b.read(CHUNK))
                    for s in [s for s in skip if off <= s < off + len(x)]:
                        x[s - off] = y[s - off] = 0
                    if x != y:
                        i = next(i for i in range(len(x)) if x[i] != y[i])
                        fail("differs from torch's writer at byte %d" % (off + i))
                    off += len(x)
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "check":
        check(sys.argv[2], "--ref" in sys.argv[3:])
    else:
        sys.exit(__doc__)
