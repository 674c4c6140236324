# SPDX-License-Identifier: MIT
"""The scale figure of flexfs-bench (--only scale): mounts of DCP
checkpoints with many chunks (gen_scale.py), and the read rate of a rank
file made of small items against the same bytes in large items.

Rows, each against a baseline measured in the same run (medians of
--runs):
  - mount time (exec of flexfs to the first byte of index.json) against
    the time Python takes to pickle.load the same .metadata in a fresh
    process (the first step of torch's own loader): goal <= 0.05;
  - metadata bytes parsed per second at mount (the .metadata's size over
    the mount time): goal >= 140 MB/s;
  - the daemon's peak RSS (VmHWM when index.json is readable) per chunk:
    goal <= 128 bytes;
  - the first read of ranks/tp00_pp00/model.safetensors (TP1) of a
    checkpoint of 1 KiB items against the same bytes saved as 4 MiB items:
    goal >= 0.5.
Chunk counts: 100k and 1M; 6M with FLEXFS_BENCH_SCALE_6M=1 (its
generator holds about 6 GB of Python objects and takes minutes).
FLEXFS_BENCH_SCALE_DCP=1: the DCP mounts only (no other format, no
small-items read).  FLEXFS_BENCH_SCALE_ITEMS=1: the small-items read
only (no mount rows).  FLEXFS_BENCH_SCALE_FMT=paddle (or a
comma-separated list of paddle, megatron, mindspore): those formats' rows
only (scale_fmt.py), no DCP row and no small-items read.
"""

import json
import os
import subprocess
import sys
import time

import gen_scale
import scale_fmt

here = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(here, "gen_scale.py")
PY = "/usr/bin/python3"
MB = 1e6

LOAD = r"""
import pickle, sys, time
sys.path.insert(0, sys.argv[2])
import gen_dcp
gen_dcp.TorchAPI()
t0 = time.monotonic()
with open(sys.argv[1], "rb") as f:
    m = pickle.load(f)
print(time.monotonic() - t0)
"""


def ensure(ctx, b, name, tensors, ranks, cols, items):
    d = os.path.join(ctx.workdir, "scale-" + name)
    stamp = os.path.join(d, "scale.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            s = json.load(f)
        if (s.get("generator"), s["tensors"], s["ranks"], s["cols"], s["items"]) == \
                (gen_scale.GENERATOR, tensors, ranks, cols, items):
            return dict(s, dir=d)
    if os.path.isdir(d):
        subprocess.run(["rm", "-rf", d], check=True)
    b.log("scale: writing %s (%d tensors x %d ranks, %s items)" % (name, tensors, ranks, items))
    subprocess.run([PY, GEN, "--out", d, "--tensors", str(tensors), "--ranks", str(ranks),
                    "--cols", str(cols), "--items", items], check=True,
                   stdout=subprocess.DEVNULL)
    with open(stamp) as f:
        return dict(json.load(f), dir=d)


def pickle_load_s(path):
    out = subprocess.run([PY, "-c", LOAD, path, os.path.join(here, "..", "fixtures")],
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def fig_mounts(ctx, b, info):
    n, meta = info["chunks"], info["metadata_bytes"]
    tag = "%s chunks (%.0f MB .metadata)" % (format(n, ","), meta / MB)
    r_time = b.Row("scale", "mount, %s, vs Python pickle.load of it" % tag, "s",
                   "pickle.load", 0.05, better="lower",
                   note="exec of flexfs to the first byte of index.json, warm cache")
    r_rate = b.Row("scale", "metadata parsed per second at mount, %s" % tag, "MB/s", "",
                   140 * MB, ratio_unit="MB/s", note="bytes of .metadata / mount time")
    r_rss = b.Row("scale", "daemon peak RSS per chunk at mount, %s" % tag, "B", "", 128,
                  better="lower", ratio_unit="B", note="VmHWM / chunks")
    path = os.path.join(info["dir"], ".metadata")
    diag = []
    for i in range(ctx.runs):
        b.warm(b.backing_files(info["dir"]) + [path])
        base = pickle_load_s(path)
        with b.Mount(ctx, info["dir"], "tp=1", name="scale") as m:
            st = m.at_mount
        hwm = st.get("VmHWM") or float("nan")
        r_time.add(base, m.latency, m.latency / base)
        r_rate.add(None, meta / m.latency, meta / m.latency)
        r_rss.add(None, hwm / n, hwm / n)
        diag.append(dict(pickle_load_s=base, mount_s=m.latency, VmHWM=hwm,
                         cpu_s=st.get("utime", 0) + st.get("stime", 0)))
        b.log("scale %s run %d: mount %.2f s, pickle.load %.2f s, VmHWM %.0f MiB"
              % (tag, i, m.latency, base, hwm / 2**20))
    ctx.diag.setdefault("scale", {})[tag] = diag
    return [r_time, r_rate, r_rss]


def read_all(path):
    t0 = time.monotonic()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            k = len(f.read(1 << 20))
            if not k:
                break
            n += k
    return n, time.monotonic() - t0


def fig_items(ctx, b):
    small = ensure(ctx, b, "items-1k", 65536, 1, 256, "real")
    large = ensure(ctx, b, "items-4m", 16, 1, 1 << 20, "real")
    row = b.Row("scale", "first read of ranks/*/model.safetensors, 64 MiB in 1 KiB items "
                "vs in 4 MiB items", "GB/s", "4 MiB items", 0.5,
                note="TP1 view of a 1-rank checkpoint, backing files warm")
    for i in range(ctx.runs):
        rates = {}
        for info in (large, small):
            b.warm(b.backing_files(info["dir"]))
            with b.Mount(ctx, info["dir"], "tp=1", name="items") as m:
                n, s = read_all(m.path("ranks", "tp00_pp00", "model.safetensors"))
            rates[info["dir"]] = n / s
        row.add(rates[large["dir"]], rates[small["dir"]],
                rates[small["dir"]] / rates[large["dir"]])
    return [row]


def fig_scale(ctx, b):
    if os.environ.get("FLEXFS_BENCH_SCALE_ITEMS") == "1":
        return fig_items(ctx, b)
    only = os.environ.get("FLEXFS_BENCH_SCALE_FMT")
    if only:
        # the named non-DCP rows alone (paddle, megatron, mindspore)
        return scale_fmt.fig_scale_fmt(ctx, b, only.split(","))
    rows = []
    sizes = [("100k", 1000, 100), ("1m", 1000, 1000)]
    if os.environ.get("FLEXFS_BENCH_SCALE_6M") == "1":
        sizes.append(("6m", 1000, 6000))
    for name, t, r in sizes:
        info = ensure(ctx, b, name, t, r, 4, "repeat")
        rows += fig_mounts(ctx, b, info)
    if os.environ.get("FLEXFS_BENCH_SCALE_DCP") == "1":
        return rows
    rows += scale_fmt.fig_scale_fmt(ctx, b)
    rows += fig_items(ctx, b)
    return rows


if __name__ == "__main__":
    sys.exit("run through tools/bench/flexfs-bench --only scale")
