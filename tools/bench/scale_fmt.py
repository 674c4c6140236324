# SPDX-License-Identifier: MIT
"""The scale figure's rows for the other sources (flexfs-bench --only
scale): mounts of a Paddle Flex checkpoint of 100k and 1M chunks, of a
Megatron-Core torch_dist one of 1M chunks, and of a MindSpore checkpoint
whose strategy spans 4,096 ranks (gen_scale_fmt.py writes them);
FLEXFS_BENCH_SCALE_FMT=paddle,... (scale.py) runs only the formats named.  The same three rows as the DCP ones
(scale.py), medians of --runs, each against a baseline measured in the
same run:

  - mount time (exec of flexfs to the first byte of index.json) against
    Python's own decode of the same metadata in a fresh process: Paddle's
    0.metadata and Megatron's .metadata by pickle.load (the classes
    importable, as in paddle.load / torch's loader), the MindSpore strategy
    by python3-protobuf's ParallelStrategyMap.ParseFromString (and, in a
    second row, the strategy plus every rank file's Checkpoint messages,
    which MindSpore's loader parses too): goal <= 0.05;
  - metadata bytes parsed per second at mount: goal >= 140 MB/s;
  - the daemon's peak RSS (VmHWM when index.json is readable) per chunk:
    goal <= 128 bytes.
"""

import json
import os
import subprocess

from gen_scale_fmt import GENERATOR as GEN_VERSION

here = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(here, "gen_scale_fmt.py")
FIXTURES = os.path.join(here, "..", "fixtures")
PY = "/usr/bin/python3"
MB = 1e6

LOAD_PADDLE = r"""
import pickle, sys, time
sys.path.insert(0, sys.argv[2])
import gen_paddle
gen_paddle.install_classes("flex", "flex2026")
t0 = time.monotonic()
with open(sys.argv[1], "rb") as f:
    m = pickle.load(f)
print(time.monotonic() - t0)
"""

LOAD_MEGATRON = r"""
import pickle, sys, time
sys.path.insert(0, sys.argv[2])
import gen_dcp
gen_dcp.TorchAPI()
t0 = time.monotonic()
with open(sys.argv[1], "rb") as f:
    m = pickle.load(f)
print(time.monotonic() - t0)
"""

# argv: strategy file, fixtures dir, then the rank files (none: strategy only)
LOAD_MINDSPORE = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
import gen_mindspore
C, S = gen_mindspore.pb()
t0 = time.monotonic()
with open(sys.argv[1], "rb") as f:
    m = S.ParallelStrategyMap()
    m.ParseFromString(f.read())
for p in sys.argv[3:]:
    with open(p, "rb") as f:
        c = C.Checkpoint()
        c.ParseFromString(f.read())
print(time.monotonic() - t0)
"""

LABEL = {"paddle": "Paddle Flex", "megatron": "Megatron torch_dist",
         "mindspore": "MindSpore"}


def ensure(ctx, b, fmt, name, tensors, ranks, cols=4, plans=False):
    d = os.path.join(ctx.workdir, "scale-%s-%s" % (fmt, name))
    stamp = os.path.join(d, "scale.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            s = json.load(f)
        if (s["format"], s.get("generator"), s["tensors"], s["ranks"], s["cols"],
                s.get("plans", False)) == (fmt, GEN_VERSION, tensors, ranks, cols, plans):
            return dict(s, dir=d)
    if os.path.isdir(d):
        subprocess.run(["rm", "-rf", d], check=True)
    b.log("scale: writing %s %s (%d tensors x %d ranks)" % (fmt, name, tensors, ranks))
    subprocess.run([PY, GEN, fmt, "--out", d, "--tensors", str(tensors), "--ranks", str(ranks),
                    "--cols", str(cols)] + (["--plans"] if plans else []), check=True,
                   stdout=subprocess.DEVNULL)
    with open(stamp) as f:
        return dict(json.load(f), dir=d)


def all_files(d):
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.join(root, n) for n in names if n != "scale.json"]
    return sorted(out)


def rank_files(info):
    return [p for p in all_files(os.path.join(info["dir"], "ckpt")) if p.endswith(".ckpt")]


def python_decode_s(info, with_ranks=False):
    meta = os.path.join(info["dir"], info["metadata"][0])
    argv = [meta, FIXTURES]
    if info["format"] == "mindspore":
        code = LOAD_MINDSPORE
        if with_ranks:
            argv += rank_files(info)
    else:
        code = LOAD_PADDLE if info["format"] == "paddle" else LOAD_MEGATRON
    out = subprocess.run([PY, "-c", code] + argv, check=True, capture_output=True,
                         text=True).stdout
    return float(out.split()[-1])


def fig_mounts_fmt(ctx, b, info):
    fmt, n = info["format"], info["chunks"]
    meta = info["metadata_bytes"]
    parsed = meta + info.get("rank_file_bytes", 0)
    mname = os.path.basename(info["metadata"][0])
    tag = "%s %s chunks (%.1f MB %s%s)" % (LABEL[fmt], format(n, ","), meta / MB, mname,
                                           ", all_local_plans" if info.get("plans") else "")
    if fmt == "mindspore":
        tag = "%s %s chunks, %d ranks (%.2f MB strategy, %.0f MB rank files)" % (
            LABEL[fmt], format(n, ","), info["ranks"], meta / MB,
            info["rank_file_bytes"] / MB)
        base_desc = "protobuf parse"
    else:
        base_desc = "pickle.load"
    r_time = b.Row("scale", "mount, %s, vs Python %s of it" % (tag, base_desc), "s",
                   base_desc, 0.05, better="lower",
                   note="exec of flexfs to the first byte of index.json, warm cache")
    rows = [r_time]
    r_all = None
    if fmt == "mindspore":
        r_all = b.Row("scale", "mount, %s, vs Python protobuf parse of the strategy and "
                      "every rank file" % tag, "s", "protobuf parse", 0.05, better="lower",
                      note="MindSpore's loader parses every rank file's Checkpoint messages")
        rows.append(r_all)
    r_rate = b.Row("scale", "metadata parsed per second at mount, %s" % tag, "MB/s", "",
                   140 * MB, ratio_unit="MB/s",
                   note="bytes of %s / mount time" % ("strategy + rank files"
                                                      if fmt == "mindspore" else mname))
    r_rss = b.Row("scale", "daemon peak RSS per chunk at mount, %s" % tag, "B", "", 128,
                  better="lower", ratio_unit="B", note="VmHWM / chunks")
    rows += [r_rate, r_rss]
    files = all_files(info["dir"])
    mdir = os.path.join(info["dir"], info["mount_dir"])
    opts = "tp=1" + ("," + info["opts"] if info["opts"] else "")
    diag = []
    for i in range(ctx.runs):
        b.warm(files)
        base = python_decode_s(info)
        base_all = python_decode_s(info, True) if r_all else None
        with b.Mount(ctx, mdir, opts, name="scale") as m:
            st = m.at_mount
        hwm = st.get("VmHWM") or float("nan")
        r_time.add(base, m.latency, m.latency / base)
        if r_all:
            r_all.add(base_all, m.latency, m.latency / base_all)
        r_rate.add(None, parsed / m.latency, parsed / m.latency)
        r_rss.add(None, hwm / n, hwm / n)
        diag.append(dict(python_s=base, python_all_s=base_all, mount_s=m.latency, VmHWM=hwm,
                         cpu_s=st.get("utime", 0) + st.get("stime", 0)))
        b.log("scale %s run %d: mount %.2f s, Python %.3f s%s, VmHWM %.0f MiB"
              % (tag, i, m.latency, base,
                 "" if base_all is None else " (%.2f s with the rank files)" % base_all,
                 hwm / 2**20))
    ctx.diag.setdefault("scale", {})[tag] = diag
    return rows


def fig_scale_fmt(ctx, b, only=None):
    """Paddle Flex of 100k chunks (1,000 tensors x 100 ranks), Paddle Flex
    and Megatron torch_dist of 1M chunks (1,000 tensors x 1,000 ranks),
    MindSpore of 256 tensors x 4,096 ranks (1,048,576 chunks); only: the
    formats to run (None: all)."""
    rows = []
    for fmt, name, t, r in (("paddle", "100k", 1000, 100), ("paddle", "1m", 1000, 1000),
                            ("megatron", "1m", 1000, 1000),
                            ("mindspore", "4096r", 256, 4096)):
        if only is not None and fmt not in only:
            continue
        rows += fig_mounts_fmt(ctx, b, ensure(ctx, b, fmt, name, t, r))
    # Megatron-Core's own shape (all_local_plans beside the DCP metadata)
    if (os.environ.get("FLEXFS_BENCH_SCALE_PLANS") == "1" if only is None
            else "megatron-plans" in only):
        rows += fig_mounts_fmt(ctx, b, ensure(ctx, b, "megatron", "1m-plans", 1000, 1000,
                                              plans=True))
    return rows
