#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Why a re-read of FUSE page cache is slower than a re-read of a plain
file (issue #24): the loaders figure's re-read rows, taken apart.

    reread.py FLEXFS FUSEPASS CKPT VIEWS [--rounds N] [--passes K] [--json F]

CKPT: the loaders figure's TP2 checkpoint; VIEWS: its plain copies of
ranks/*/ (WORKDIR/*-views-tp2).  Root (tracefs, sysfs, fadvise).  The
loaders.py modes read and mmap of both ranks' model.safetensors, each pass a
fresh process (as the loaders figure runs them), on five targets in a
rotated order:

  views     VIEWS' files as the loaders figure leaves them (the floor there)
  ext4-ra   scratch copies, dropped then filled by one sequential read:
            readahead's large folios
  ext4-o0   scratch copies, dropped then filled 4 KiB at a time with
            POSIX_FADV_RANDOM: order-0 folios, as a FUSE file gets them
  fusepass  flexfs-fusepass serving VIEWS, fresh mount per round (the FUSE
            limit of the loaders figure), its bdi readahead set to flexfs's
  flexfs    flexfs CKPT -o tp=2, fresh mount per round

Per round: a first read (a fresh FUSE mount's page cache is empty; the
plain files are in page cache), then K re-reads.  Printed per target, mode
and pass: wall seconds and the reader's CPU seconds per GB (getrusage of
the child: the load changes it little), median [min, max] over rounds.
Once, outside the timed passes: the FUSE requests of each pass (tracepoint
fuse:fuse_request_send of the mount's connection: a re-read from the kept
page cache sends no READ), the resident bytes of the served files after
the passes (fincore), the folio orders each target's page cache was
filled with (tracepoint filemap:mm_filemap_add_to_page_cache), and the
cost of one open()+close() of each target's file (a FUSE open is a round
trip to the daemon: OPEN, and RELEASE after the close).
"""
import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

from kfile import get, put

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.environ.get("FLEXFS_BENCH_PYTHON", "/usr/bin/python3")
LD = os.path.join(HERE, "loaders.py")
TR = "/sys/kernel/tracing"


def kdev(path):
    st = os.stat(path)
    return (os.major(st.st_dev) << 20) | os.minor(st.st_dev)


def bdi(path):
    st = os.stat(path)
    return "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(st.st_dev), os.minor(st.st_dev))


class Trace:
    """One tracepoint, filtered, counted by a regex over its lines."""

    def __init__(self, event, filt):
        self.ev = os.path.join(TR, "events", event)
        self.filt = filt

    def __enter__(self):
        put(os.path.join(self.ev, "filter"), self.filt)
        put(os.path.join(TR, "buffer_size_kb"), "65536")
        put(os.path.join(TR, "trace"), "")
        put(os.path.join(self.ev, "enable"), "1")
        put(os.path.join(TR, "tracing_on"), "1")
        return self

    def __exit__(self, *exc):
        put(os.path.join(TR, "tracing_on"), "0")
        put(os.path.join(self.ev, "enable"), "0")
        put(os.path.join(self.ev, "filter"), "0")
        with open(os.path.join(TR, "trace")) as f:
            self.text = f.read()
        put(os.path.join(TR, "trace"), "")

    def count(self, rx):
        m = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", self.text)
        lost = m and m.group(1) != m.group(2)
        return collections.Counter(re.findall(rx, self.text)), bool(lost)


class Daemon:
    def __init__(self, argv, mnt, ready):
        os.makedirs(mnt, exist_ok=True)
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], check=False)
        self.mnt = mnt
        self.p = subprocess.Popen(argv + [mnt, "-f"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while not os.path.exists(os.path.join(mnt, ready)):
            if self.p.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError("%s did not mount" % argv[0])
            time.sleep(0.01)

    def stop(self):
        subprocess.run(["fusermount3", "-u", self.mnt], check=True)
        self.p.wait()


def warm(files):
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 20):
                pass


def files_of(d):
    return sorted(os.path.join(r, n) for r, _, ns in os.walk(os.path.join(d, "ranks"))
                  for n in ns if n == "model.safetensors")


def resident(files):
    """(resident bytes, size) of files: fincore (mincore of a mapping)."""
    out = subprocess.run(["fincore", "-b", "-n", "-r", "-o", "RES,SIZE"] + files, check=True,
                         stdout=subprocess.PIPE, text=True).stdout.split()
    return sum(int(x) for x in out[0::2]), sum(int(x) for x in out[1::2])


def fill(files, order0):
    """Drop files from the page cache and read them back: sequentially
    (readahead: large folios) or 4 KiB at a time without readahead."""
    subprocess.run(["sync"], check=True)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if order0:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                for off in range(0, os.fstat(fd).st_size, 4096):
                    os.pread(fd, 4096, off)
            else:
                while os.read(fd, 1 << 20):
                    pass
        finally:
            os.close(fd)


def open_cost(path, n=2000):
    t0 = time.monotonic()
    for _ in range(n):
        os.close(os.open(path, os.O_RDONLY))
    return (time.monotonic() - t0) / n


def run_loader(mode, files):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([PY, LD, "--mode", mode] + sum([["--file", f] for f in files], []),
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    j = json.loads(out.strip().splitlines()[-1])
    return j["seconds"], (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), j["bytes"]


TARGETS = ("views", "ext4-ra", "ext4-o0", "fusepass", "flexfs")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("flexfs")
    ap.add_argument("fusepass")
    ap.add_argument("ckpt")
    ap.add_argument("views")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3, help="re-reads after the first read")
    ap.add_argument("--modes", default="read,mmap")
    ap.add_argument("--work", default="/var/tmp/flexfs-reread")
    ap.add_argument("--json")
    a = ap.parse_args()
    views = os.path.abspath(a.views)
    os.makedirs(a.work, exist_ok=True)
    mf, mp = os.path.join(a.work, "mnt-flexfs"), os.path.join(a.work, "mnt-fusepass")
    vfiles = files_of(views)
    rel = [os.path.relpath(f, views) for f in vfiles]
    scratch = {}
    for t in ("ext4-ra", "ext4-o0"):
        scratch[t] = [os.path.join(a.work, t, "%d.safetensors" % i) for i in range(len(vfiles))]
        os.makedirs(os.path.join(a.work, t), exist_ok=True)
        for src, dst in zip(vfiles, scratch[t]):
            if not os.path.exists(dst) or os.path.getsize(dst) != os.path.getsize(src):
                subprocess.run(["cp", src, dst], check=True)
    backing = [os.path.join(a.ckpt, n) for n in os.listdir(a.ckpt)]
    modes = a.modes.split(",")
    res = collections.defaultdict(list)
    diag = {"requests": {}, "resident": {}, "folio_orders": {}, "open_close_us": {}}
    load0 = os.getloadavg()

    def mount_both():
        fx = Daemon([a.flexfs, a.ckpt, "-o", "tp=2"], mf, "index.json")
        fp = Daemon([a.fusepass, views], mp, "ranks")
        put(bdi(mp), get(bdi(mf)))
        return fx, fp

    def files(t):
        if t in scratch:
            return scratch[t]
        return vfiles if t == "views" else [os.path.join(mp if t == "fusepass" else mf, r)
                                            for r in rel]

    def traced_fill(t, how):
        # the device is shared with every other file of the file system
        inos = " || ".join("i_ino == %d" % os.stat(f).st_ino for f in files(t))
        filt = "s_dev == %d && (%s)" % (kdev(files(t)[0]), inos)
        with Trace("filemap/mm_filemap_add_to_page_cache", filt) as tr:
            how()
        c, lost = tr.count(r"order=(\d+)")
        diag["folio_orders"][t] = dict(sorted((int(o), n) for o, n in c.items()), lost=lost)

    traced_fill("ext4-ra", lambda: fill(scratch["ext4-ra"], False))
    traced_fill("ext4-o0", lambda: fill(scratch["ext4-o0"], True))
    for rnd in range(a.rounds):
        for mode in modes:
            warm(vfiles + backing)
            fx, fp = mount_both()
            order = TARGETS[rnd % len(TARGETS):] + TARGETS[:rnd % len(TARGETS)]
            first = rnd == 0 and mode == modes[0]
            for ps in range(a.passes + 1):
                for t in order:
                    fuse = t in ("fusepass", "flexfs")
                    if fuse and first and ps == 0:
                        d = os.path.dirname(files(t)[0])
                        with Trace("filemap/mm_filemap_add_to_page_cache",
                                   "s_dev == %d" % kdev(d)) as tr:
                            s, c, n = run_loader(mode, files(t))
                        cnt, lost = tr.count(r"order=(\d+)")
                        diag["folio_orders"][t] = dict(sorted((int(o), k) for o, k in
                                                              cnt.items()), lost=lost)
                    elif fuse and rnd == 0:
                        with Trace("fuse/fuse_request_send",
                                   "connection == %d" % kdev(files(t)[0])) as tr:
                            s, c, n = run_loader(mode, files(t))
                        cnt, lost = tr.count(r"\((FUSE_[A-Z_]+)\)")
                        diag["requests"]["%s/%s/pass%d" % (t, mode, ps)] = dict(cnt, lost=lost)
                    else:
                        s, c, n = run_loader(mode, files(t))
                    res[(t, mode, ps)].append((s, c, n))
            if rnd == 0:
                for t in TARGETS:
                    diag["resident"]["%s/%s" % (t, mode)] = resident(files(t))
                    diag["open_close_us"].setdefault(t, []).append(open_cost(files(t)[0]) * 1e6)
            fx.stop()
            fp.stop()
    load1 = os.getloadavg()

    med = statistics.median
    print("load average %.2f at the start, %.2f at the end; %d rounds" % (load0[0], load1[0],
                                                                          a.rounds))
    print("| target | mode | pass | wall s med [min, max] | reader CPU s/GB med [min, max] "
          "| views time / target time |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        for ps in range(a.passes + 1):
            base = res[("views", mode, ps)]
            for t in TARGETS:
                v = res[(t, mode, ps)]
                gb = v[0][2] / 1e9
                ratio = [p[0] / x[0] for p, x in zip(base, v)]
                print("| %s | %s | %s | %.4f [%.4f, %.4f] | %.3f [%.3f, %.3f] "
                      "| %.2f [%.2f, %.2f] |" % (
                          t, mode, "first" if ps == 0 else "re-read %d" % ps,
                          med([x[0] for x in v]), min(x[0] for x in v), max(x[0] for x in v),
                          med([x[1] for x in v]) / gb, min(x[1] for x in v) / gb,
                          max(x[1] for x in v) / gb, med(ratio), min(ratio), max(ratio)))
    print(json.dumps(diag, indent=None))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(samples={"%s/%s/%d" % k: v for k, v in res.items()}, diag=diag,
                           load=[load0, load1]), f)


if __name__ == "__main__":
    sys.exit(main())
