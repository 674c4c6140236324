#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""FUSE_PASSTHROUGH for the hf/ view of a Hugging Face checkpoint (issue
#24): what the kernel's passthrough would gain over flexfs's /dev/fuse data
path for a view file that is byte for byte one backing file.

    hfpass.py FLEXFS FUSEPASS SRC [--rounds N] [--work W] [--json F]

SRC: a Hugging Face checkpoint directory with one model.safetensors (copied
once into W/src, so that the torch 2.6 chroot sees it).  Root.  Checks first
whether flexfs's hf/model.safetensors of SRC is byte-identical to
SRC/model.safetensors (cmp), and says so.  Then per round and loader, on
fresh mounts, the targets in a rotated order, first read then re-read, each
loader a fresh process (loaders.py --file):

  plain        W/src/model.safetensors in page cache (the floor)
  flexfs       flexfs W/src -o tp=1: hf/model.safetensors
  fuse         flexfs-fusepass of W/src over /dev/fuse (the FUSE limit)
  passthrough  flexfs-fusepass with FLEXFS_FUSEPASS_PASSTHROUGH=1: every
               open answered with the kernel's FUSE_PASSTHROUGH
               (Linux >= 6.9), reads and mmap served by the backing file
  flexfs-pt    flexfs W/src -o tp=1,passthrough: hf/model.safetensors, when
               it is byte-identical to SRC's (else the row is flexfs's own
               path again); its daemon's counters (FLEXFS_FUSE_STATS) are
               checked for no READ request

Loaders: read, mmap (python3 on the host); st_load, st_open in the torch
2.6 chroot (/opt/trixie) when it exists.  Printed: plain time / target
time, median [min, max], and the reader's and the daemon's CPU seconds
per GB (load-independent).
"""
import argparse
import collections
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.environ.get("FLEXFS_BENCH_PYTHON", "/usr/bin/python3")
CHROOT = "/opt/trixie"
TARGETS = ("plain", "flexfs", "fuse", "passthrough", "flexfs-pt")
# flexfs -o passthrough must serve no READ (set once hf/ is known to be SRC's
# file byte for byte)
CHECK_PT = [False]


def cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


def warm(files):
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 20):
                pass


class Daemon:
    def __init__(self, argv, mnt, ready, env=None):
        os.makedirs(mnt, exist_ok=True)
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], check=False)
        self.mnt = mnt
        self.err = mnt + ".err"
        with open(self.err, "w") as err:
            self.p = subprocess.Popen(argv + [mnt, "-f"], stdin=subprocess.DEVNULL,
                                      stdout=err, stderr=err,
                                      env=dict(os.environ, **(env or {})))
        t0 = time.monotonic()
        while not os.path.exists(os.path.join(mnt, ready)):
            if self.p.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError("%s did not mount: %s" % (argv[0], open(self.err).read()))
            time.sleep(0.01)

    def stop(self):
        subprocess.run(["fusermount3", "-u", self.mnt], check=True)
        self.p.wait()
        # flexfs -o passthrough: its counters (FLEXFS_FUSE_STATS=1)
        for line in open(self.err):
            m = re.match(r"flexfs: fuse stats: reads (\d+) opens (\d+) passthrough (\d+)", line)
            if m and CHECK_PT[0] and (int(m.group(1)) or not int(m.group(3))):
                sys.exit("hfpass: flexfs -o passthrough served %s READs, %s passthrough opens"
                         % (m.group(1), m.group(3)))


def bdi(path):
    st = os.stat(path)
    return "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(st.st_dev), os.minor(st.st_dev))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("flexfs")
    ap.add_argument("fusepass")
    ap.add_argument("src")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=None,
                    help="work dir (default %s/tmp/flexfs-hfpass, else /var/tmp)" % CHROOT)
    ap.add_argument("--loaders", default=None, help="comma list (default: all available)")
    ap.add_argument("--json")
    a = ap.parse_args()
    chroot = os.path.isdir(os.path.join(CHROOT, "usr"))
    w = a.work or (os.path.join(CHROOT, "tmp", "flexfs-hfpass") if chroot
                   else "/var/tmp/flexfs-hfpass")
    inner = w[len(CHROOT):] if chroot and w.startswith(CHROOT + "/") else None
    loaders = a.loaders.split(",") if a.loaders else \
        ["read", "mmap"] + (["st_load", "st_open"] if inner else [])
    src = os.path.join(w, "src")
    if not os.path.exists(os.path.join(src, ".complete")):
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(a.src, src)
        open(os.path.join(src, ".complete"), "w").close()
    shutil.copy2(os.path.join(HERE, "loaders.py"), w)
    plain = os.path.join(src, "model.safetensors")
    mnt = {t: os.path.join(w, "mnt-" + t) for t in TARGETS[1:]}
    path = {"plain": plain, "flexfs": os.path.join(mnt["flexfs"], "hf", "model.safetensors"),
            "fuse": os.path.join(mnt["fuse"], "model.safetensors"),
            "passthrough": os.path.join(mnt["passthrough"], "model.safetensors"),
            "flexfs-pt": os.path.join(mnt["flexfs-pt"], "hf", "model.safetensors")}

    def mount_all():
        d = {"flexfs": Daemon([a.flexfs, src, "-o", "tp=1"], mnt["flexfs"], "index.json"),
             "fuse": Daemon([a.fusepass, src], mnt["fuse"], "model.safetensors"),
             "passthrough": Daemon([a.fusepass, src], mnt["passthrough"], "model.safetensors",
                                   {"FLEXFS_FUSEPASS_PASSTHROUGH": "1"}),
             "flexfs-pt": Daemon([a.flexfs, src, "-o", "tp=1,passthrough"], mnt["flexfs-pt"],
                                 "index.json", {"FLEXFS_FUSE_STATS": "1"})}
        # flexfs raised its bdi's readahead at its first request (the
        # lookup of index.json): the FUSE targets get the same
        for t in ("fuse", "passthrough", "flexfs-pt"):
            with open(bdi(mnt["flexfs"])) as f, open(bdi(mnt[t]), "w") as g:
                g.write(f.read())
        return d

    def cmd(mode, t):
        if mode in ("st_load", "st_open"):
            return ["chroot", CHROOT, "python3", inner + "/loaders.py", "--mode", mode,
                    "--file", path[t][len(CHROOT):]]
        return [PY, os.path.join(w, "loaders.py"), "--mode", mode, "--file", path[t]]

    warm([plain])
    ds = mount_all()
    same = subprocess.run(["cmp", "-s", path["flexfs"], plain]).returncode == 0
    CHECK_PT[0] = same
    for t in ("fuse", "passthrough") + (("flexfs-pt",) if same else ()):
        if subprocess.run(["cmp", "-s", path[t], plain]).returncode != 0:
            sys.exit("hfpass: %s serves other bytes than %s" % (t, plain))
    for d in ds.values():
        d.stop()
    size = os.path.getsize(plain)
    print("hf/model.safetensors of flexfs %s SRC/model.safetensors (%d bytes)" % (
        "is byte-identical to" if same else "DIFFERS from", size))
    load0 = os.getloadavg()[0]
    res = collections.defaultdict(list)
    for rnd in range(a.rounds):
        for mode in loaders:
            warm([plain])
            ds = mount_all()
            k = rnd % len(TARGETS)
            order = TARGETS[k:] + TARGETS[:k]
            for ph in ("first", "re-read"):
                for t in order:
                    c0 = cpu(ds[t].p.pid) if t in ds else 0.0
                    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    out = subprocess.run(cmd(mode, t), check=True, stdout=subprocess.PIPE,
                                         text=True).stdout
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    dc = (cpu(ds[t].p.pid) - c0) if t in ds else 0.0
                    j = json.loads(out.strip().splitlines()[-1])
                    rc = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
                    res[(mode, ph, t)].append((j["seconds"], rc, dc, j["bytes"]))
            for d in ds.values():
                d.stop()
            bad = [t for t in TARGETS if res[(mode, "first", t)][-1][3] !=
                   res[(mode, "first", "plain")][-1][3]]
            if bad:
                sys.exit("hfpass: %s: byte counts differ for %s" % (mode, bad))
        print("round %d done, load %.2f" % (rnd, os.getloadavg()[0]), file=sys.stderr)
    load1 = os.getloadavg()[0]
    med = statistics.median
    gb = size / 1e9
    print("load average %.2f at the start, %.2f at the end; %d rounds; ratios plain time / "
          "target time, median [min, max]; CPU s per GB: reader / daemon (medians)" % (
              load0, load1, a.rounds))
    print("| loader, phase | plain (s) | flexfs hf/ | FUSE limit | FUSE_PASSTHROUGH proto | "
          "flexfs -o passthrough | flexfs -o passthrough / flexfs | CPU s/GB plain | flexfs | "
          "FUSE | passthrough proto | flexfs -o passthrough |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in loaders:
        for ph in ("first", "re-read"):
            pl = res[(mode, ph, "plain")]
            cells = []
            for t in ("flexfs", "fuse", "passthrough", "flexfs-pt"):
                r = [p[0] / x[0] for p, x in zip(pl, res[(mode, ph, t)])]
                cells.append("%.2f [%.2f, %.2f]" % (med(r), min(r), max(r)))
            g = [f[0] / p[0] for f, p in zip(res[(mode, ph, "flexfs")],
                                             res[(mode, ph, "flexfs-pt")])]
            cells.append("%.2f [%.2f, %.2f]" % (med(g), min(g), max(g)))
            for t in TARGETS:
                v = res[(mode, ph, t)]
                c = "%.3f" % (med([x[1] for x in v]) / gb)
                if t != "plain":
                    c += " / %.3f" % (med([x[2] for x in v]) / gb)
                cells.append(c)
            print("| %s, %s | %.3f | %s |" % (mode, ph, med([x[0] for x in pl]),
                                              " | ".join(cells)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(identical=same, load=[load0, load1],
                           samples={"%s/%s/%s" % k: v for k, v in res.items()}), f)


if __name__ == "__main__":
    sys.exit(main())
