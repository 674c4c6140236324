#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""CPU time per GB of flexfs-fusepass on /dev/fuse against its FUSE-over-
io_uring prototype (FLEXFS_FUSEPASS_URING=1), the load-independent side of
the loaders figure's io_uring columns (docs/performance.md, issue #24).

    uring_cpu.py FUSEPASS VIEWS [ROUNDS] [--ra-kb KB]

VIEWS: the loaders figure's plain copies of a TP2 view (WORKDIR/*-views-tp2).
Per round and transport, on fresh mounts: cat of ranks/*/model.safetensors
(first read, then re-read) and loaders.py --mode mmap (first, re-read).
Daemon CPU from /proc/<pid>/stat (all threads), reader CPU from getrusage
of the child.  Root: sets the fuse module's enable_uring for the io_uring
mount's INIT only, then back."""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from kfile import get, put

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("fusepass")
ap.add_argument("views")
ap.add_argument("rounds", type=int, nargs="?", default=3)
ap.add_argument("--ra-kb", default="3984", help="bdi read_ahead_kb (flexfs sets 3984 here)")
ap.add_argument("--json", help="raw samples to this file")
args = ap.parse_args()
FP, V, N, RA = args.fusepass, os.path.abspath(args.views), args.rounds, args.ra_kb
PARAM = "/sys/module/fuse/parameters/enable_uring"
PY = os.environ.get("FLEXFS_BENCH_PYTHON", "/usr/bin/python3")
LD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loaders.py")
files = [os.path.join(r, n) for r, _, ns in os.walk(V) for n in ns if n == "model.safetensors"]
nbytes = sum(os.path.getsize(f) for f in files)


def cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


def run(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    t = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def mount(kind, mnt):
    os.makedirs(mnt, exist_ok=True)
    env = dict(os.environ)
    if kind == "uring":
        env["FLEXFS_FUSEPASS_URING"] = "1"
        old = get(PARAM)
        put(PARAM, "Y")
    with open("/tmp/uring_cpu-%d-%s.err" % (os.getpid(), kind), "w") as err:
        p = subprocess.Popen([FP, V, mnt, "-f"], env=env, stderr=err)
    try:
        for _ in range(5000):
            if os.path.ismount(mnt):
                break
            time.sleep(0.002)
        with open(os.path.join(mnt, "ranks/tp00_pp00/model.safetensors"), "rb") as f:
            f.read(1)
    finally:
        if kind == "uring":
            put(PARAM, old)
    st = os.stat(mnt)
    put("/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(st.st_dev), os.minor(st.st_dev)), RA)
    return p


def umount(p, mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    p.wait()


res = {}
for i in range(N):
    for kind in (("dev", "uring") if i % 2 == 0 else ("uring", "dev")):
        for test in ("read", "mmap"):
            mnt = "/tmp/uring_cpu-%d-mnt-%s" % (os.getpid(), kind)
            for f in files:  # backing copies in page cache
                with open(f, "rb") as fh:
                    while fh.read(1 << 20): pass
            p = mount(kind, mnt)
            mf = [os.path.join(mnt, os.path.relpath(f, V)) for f in files]
            for ph in ("first", "re-read"):
                c0 = cpu(p.pid)
                if test == "read":
                    t, rc = run(["cat"] + mf)
                else:
                    t, rc = run([PY, LD, "--mode", "mmap", "--dir", mnt, "--tp", "2"])
                dc = cpu(p.pid) - c0
                res.setdefault((kind, test, ph), []).append((t, dc, rc))
            umount(p, mnt)
            os.rmdir(mnt)
            errf = "/tmp/uring_cpu-%d-%s.err" % (os.getpid(), kind)
            print(get(errf).splitlines()[-1], file=sys.stderr)
            os.remove(errf)
gb = nbytes / 1e9
print("%d bytes; median of %d; wall s, daemon CPU s/GB, reader CPU s/GB" % (nbytes, N))
med = statistics.median
for k in sorted(res):
    v = res[k]
    print("%-6s %-5s %-8s wall %.3f [%.3f, %.3f]  daemon %.3f  reader %.3f  total %.3f" % (
        k[0], k[1], k[2], med([x[0] for x in v]), min(x[0] for x in v), max(x[0] for x in v),
        med([x[1] for x in v]) / gb, med([x[2] for x in v]) / gb, med([x[1] + x[2] for x in v]) / gb))
if args.json:
    with open(args.json, "w") as f:
        json.dump({"%s/%s/%s" % k: v for k, v in res.items()}, f)
