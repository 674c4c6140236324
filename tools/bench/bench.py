#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""flexfs read-path benchmark.  Run it through tools/bench/flexfs-bench.

    tools/bench/flexfs-bench [--size 2G] [--runs 5] [--quick] [--json FILE]
                             [--workdir /var/tmp/flexfs-bench] [--only LIST]
                             [--no-torch26] [--clean]

Builds (once, cached in the work dir) a llama-like bf16 checkpoint saved
TP2 x PP1 by torch's own DCP writer (torch 1.13, and torch 2.6 when the
Debian trixie chroot /opt/trixie exists), a 10,000-tensor checkpoint
from 64 ranks (TP8 x PP8) for the mount latency, and a checkpoint of
transposed weights (torch 1.13) for the strided gathers.  Then measures, each
against a baseline taken in the same run (median of --runs, min and max):

  contig   sequential 1 MiB reads of ranks/*/model.safetensors, TP2 source
           viewed as TP2 (contiguous shards), vs the same reads of the
           backing .distcp files: (a) first read on a fresh mount, backing
           files in the page cache, (b) re-read on the same mount, (c) cold
  strided  first read of hf/ (TP1; wo/w2 gather rows) vs backing files
  transposed
           strided gathers: a checkpoint whose bf16 weights torch saved as
           w.t() (items with stride (1, rows); 8 of about 4096 x 4096, 256
           MiB, 4 MiB with --quick), first read of hf/ (TP1) on a fresh
           mount with the default block cache and with -o cache_size=0, and
           of ranks/*/ at tp=2, vs the backing files
  gpu      the transposed checkpoint's hf/ (TP1) gathered by the CUDA
           backend (-o gpu=on,gpu_min=0) vs the CPU one (-o gpu=off) in
           the same run (goal >= 5x), and the GPU gather throughput vs the
           device's host-to-device bandwidth measured just before with
           pinned memory (goal >= 0.6); then the same tensors cast to
           float32 by the rules, GPU (gather and cast in one pass) vs CPU,
           the GPU's bytes checked equal to the CPU's; skipped with one
           line where gpu=on cannot mount (no device, driver or
           libflexfs-cuda.so)
  e2e      every tensor of a TP4 layout through flexfs (np.load mmap of
           the .npy, or read() of the safetensors) vs torch's DCP
           load_state_dict into TP4 shards; plus backing bytes read per
           byte delivered (/proc/<daemon>/io rchar)
  mount    exec of flexfs to the first byte of MNT/index.json
  memory   peak RSS (VmHWM) of the daemon over a full read of every view
  parallel 8 concurrent readers (TP8 view) vs 1 reader
  loaders  (not in the default list) real loaders (loaders.py: read(),
           mmap copy, +MADV_SEQUENTIAL/HUGEPAGE, np.load(mmap_mode='r'),
           and in the torch 2.6 chroot safetensors load_file, safe_open +
           get_tensor, torch.load(model.pt, mmap=True)) of the TP2 view,
           each in a fresh process, on (floor) plain page-cached copies of
           the view files, (FUSE limit) flexfs-fusepass serving those
           copies with flexfs's data path settings, the same with the
           kernel's FUSE_PASSTHROUGH (prototype, fusepass.c), flexfs, and
           flexfs -o direct_io: first read on fresh mounts, then re-read; targets'
           order rotated every run; in the same run torch's own DCP load into
           TP2 (1.13, and 2.6 of the checkpoint torch 2.6 wrote) against
           flexfs mount + first read of each loader (goal >= 3x), and one
           cold pass per loader: the daemon's read_bytes per byte served;
           --fuse-uring adds flexfs-fusepass on FUSE over io_uring
           (prototype; sets the fuse module's enable_uring for its INIT)
  scale    (not in the default list) mounts of DCP checkpoints of 100k
           and 1M chunks (6M with FLEXFS_BENCH_SCALE_6M=1; only these
           with FLEXFS_BENCH_SCALE_DCP=1) vs Python's
           pickle.load of the same .metadata; metadata MB/s; peak RSS per
           chunk; the same for a Paddle Flex and a Megatron torch_dist
           checkpoint of 1M chunks (vs pickle.load of their metadata) and a
           MindSpore checkpoint of 4,096 ranks (vs python3-protobuf's parse
           of its strategy, and of the strategy plus every rank file;
           scale_fmt.py, gen_scale_fmt.py; only the formats named with
           FLEXFS_BENCH_SCALE_FMT=megatron,mindspore; a Megatron 1M with
           Megatron-Core's all_local_plans too with FLEXFS_BENCH_SCALE_PLANS=1
           or FMT naming megatron-plans); a rank file of 1 KiB items vs
           the same bytes in 4 MiB items (scale.py, gen_scale.py)
  mpi      (not in the default list) flexfs-materialize of ranks/ at tp=4:
           one process vs mpirun -np 1, 2, 4 (GB/s written, per-rank rate)
  mpi      (not in the default list) the distributed mount: remote-fetch
           throughput through MPI against local reads, and the mount of
           the 10,000-tensor checkpoint spread over 2..16 ranks
           (mpi_fetch.py)
  passthrough
           -o passthrough: hf/ (TP1) of a checkpoint flexfs wrote (its own
           hf/ copied out: every file the whole of one backing file), read()
           in 1 MiB and an mmap copy, first read on fresh mounts with and
           without the option, vs the same files in page cache; the
           daemon's counters (FLEXFS_FUSE_STATS) must show no READ request
  digest   flexfs-inspect --digest of a safetensors file holding one tensor
           (256 MiB, 4 MiB with --quick) vs openssl dgst -sha256 of the same
           bytes in a plain file, both in the page cache: throughput ratio
           (goal >= 0.8); the two digests must be equal
  zstd     the checkpoint re-written as torch 2.7's ZStandard extension
           would (zstd_ckpt.py): first read of hf/ (TP1) and ranks/* (TP2,
           1 and 2 readers) vs zstd -d of the same frames to /dev/null;
           hf/ vs the lesser of zstd -d and the plain checkpoint's hf/
           (what FUSE allows); bytes decompressed per byte served;
           daemon peak RSS

--quick: a tiny checkpoint, one run of everything, and every byte read
through flexfs is compared with the ground truth (numpy slices of the
regenerated tensors) and with what torch's loader returns; exits 1 on any
mismatch, 77 when /dev/fuse is missing; no timing is asserted.
"""

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import model  # noqa: E402
from daemon_stats import daemon_stats  # noqa: E402
import readers  # noqa: E402
import mpi_fetch  # noqa: E402
import scale  # noqa: E402

PY = os.environ.get("FLEXFS_BENCH_PYTHON", "/usr/bin/python3")
CHROOT = os.environ.get("FLEXFS_TORCH2_CHROOT", "/opt/trixie")
GB = 1e9
MiB = 1 << 20


def log(msg):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------
# processes


def proc_stats(pid):
    """/proc/<pid>/{io,stat,status} of the daemon (all its threads)."""
    s = {}
    try:
        with open("/proc/%d/io" % pid) as f:
            for line in f:
                k, v = line.split(":")
                s[k] = int(v)
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        s["utime"] = int(rest[11]) / tick
        s["stime"] = int(rest[12]) / tick
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("VmHWM", "VmRSS"):
                    s[k] = int(v.split()[0]) * 1024
                elif k == "Threads":
                    s[k] = int(v)
    except FileNotFoundError:
        pass
    return s


def delta(a, b):
    d = {k: b[k] - a[k] for k in b if k in a and k not in ("VmHWM", "VmRSS", "Threads")}
    for k in ("VmHWM", "VmRSS", "Threads"):
        if k in b:
            d[k] = b[k]
    d["cpu_s"] = d.get("utime", 0) + d.get("stime", 0)
    return d


class Counters:
    """Exact counts for one diagnostic pass (perf, root): FUSE_READ
    requests of this mount (tracepoint fuse:fuse_request_send, filtered on
    opcode and connection) and the daemon's syscalls (pread64, splice,
    vmsplice, writev, read).  Not used during timed runs: enabling syscall
    tracepoints slows the traced process down."""

    SYSCALLS = ("pread64", "preadv", "splice", "vmsplice", "writev", "read")

    def __init__(self, ctx, mount):
        self.ctx, self.m = ctx, mount
        self.counts, self.procs = {}, []

    def __enter__(self):
        if not self.ctx.perf:
            return self
        st = os.stat(self.m.mnt)
        kdev = (os.major(st.st_dev) << 20) | os.minor(st.st_dev)
        base = os.path.join(self.ctx.workdir, "perf-%d" % os.getpid())
        self.files = [base + ".fuse", base + ".sys"]
        cmds = [["perf", "stat", "-x,", "-a", "-o", self.files[0], "-e", "fuse:fuse_request_send",
                 "--filter", "opcode == 15 && connection == %d" % kdev],
                ["perf", "stat", "-x,", "-o", self.files[1], "-p", str(self.m.p.pid)] +
                sum([["-e", "syscalls:sys_enter_" + c] for c in self.SYSCALLS], [])]
        for c in cmds:
            self.procs.append(subprocess.Popen(c, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        time.sleep(0.5)  # perf attaches
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            p.wait(timeout=30)
        for f in getattr(self, "files", []):
            try:
                with open(f) as fh:
                    for line in fh:
                        x = line.strip().split(",")
                        if len(x) > 2 and x[0].isdigit():
                            self.counts[x[2].split(":")[-1].replace("sys_enter_", "")] = int(x[0])
                os.remove(f)
            except OSError:
                pass
        if "fuse_request_send" in self.counts:
            self.counts["fuse_reads"] = self.counts.pop("fuse_request_send")

    def summary(self, nbytes):
        c = dict(self.counts)
        n = c.get("fuse_reads")
        if n:
            c["avg_request_bytes"] = nbytes / n
            c["preads_per_request"] = (c.get("pread64", 0) + c.get("preadv", 0)) / n
        return c


def perf_usable():
    if os.geteuid() != 0 or not shutil.which("perf"):
        return False
    r = subprocess.run(["perf", "list", "fuse:fuse_request_send"], capture_output=True, text=True)
    return "fuse_request_send" in r.stdout


class Mount:
    """flexfs CKPT MNT -f -o OPTS, in the background; latency = exec to
    the first byte of MNT/index.json."""

    active = []

    def __init__(self, ctx, ckpt, opts, name="m", stderr_ok=None, mnt=None, argv=None,
                 ready="index.json"):
        """stderr_ok: a regex; daemon stderr lines it matches are expected
        warnings (kept in .warnings and logged once), not problems.
        mnt: the mount point (default WORKDIR/mnt-NAME); argv: another
        daemon's command line (the FUSE passthrough), ready: the file whose
        first byte marks the mount ready."""
        self.ctx, self.ckpt, self.opts = ctx, ckpt, opts
        self.mnt = mnt or os.path.join(ctx.workdir, "mnt-" + name)
        self.argv, self.ready = argv, ready
        self.errf = os.path.join(ctx.workdir, "flexfs-%s.stderr" % name)
        self.stderr_ok = stderr_ok
        self.warnings = []
        self.p = None

    def start(self):
        os.makedirs(self.mnt, exist_ok=True)
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], check=False)
        idx = os.path.join(self.mnt, self.ready)
        err = open(self.errf, "w")
        t0 = time.monotonic()
        env = dict(os.environ, **self.ctx.daemon_env) if self.ctx.daemon_env else None
        argv = self.argv or [self.ctx.flexfs, self.ckpt, self.mnt, "-f", "-o", self.opts]
        self.p = subprocess.Popen(argv,
                                  stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
        err.close()
        Mount.active.append(self)
        while True:
            try:
                with open(idx, "rb", buffering=0) as f:
                    if f.read(1):
                        break
            except OSError:
                pass
            if self.p.poll() is not None:
                raise RuntimeError("flexfs exited %d before mounting: %s"
                                   % (self.p.returncode, open(self.errf).read().strip()))
            if time.monotonic() - t0 > 600:
                raise RuntimeError("flexfs did not mount within 600 s")
            time.sleep(0.0002)
        self.t_ready = time.monotonic()
        self.latency = self.t_ready - t0
        self.at_mount = proc_stats(self.p.pid)
        if self.ctx.fuse_ra_kb:
            # what-if experiment: the FUSE bdi's readahead (default 128 KiB)
            st = os.stat(self.mnt)
            with open("/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(st.st_dev),
                                                              os.minor(st.st_dev)), "w") as f:
                f.write("%d\n" % self.ctx.fuse_ra_kb)
        return self

    def stats(self):
        return proc_stats(self.p.pid)

    def path(self, *p):
        return os.path.join(self.mnt, *p)

    def stop(self):
        if self.p is None:
            return
        subprocess.run(["fusermount3", "-u", self.mnt], check=True)
        try:
            rc = self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        Mount.active.remove(self)
        self.p = None
        msg = open(self.errf).read().strip()
        if self.stderr_ok is not None:
            lines = msg.splitlines()
            self.warnings = [x for x in lines if self.stderr_ok.search(x)]
            msg = "\n".join(x for x in lines if not self.stderr_ok.search(x)).strip()
            for w in self.warnings:
                if (self.opts, w) not in self.ctx.warned:
                    self.ctx.warned.add((self.opts, w))
                    log("flexfs -o %s warned (expected): %s" % (self.opts, w))
        if rc != 0 or msg:
            self.ctx.problems.append("flexfs %s -o %s: exit %d, stderr: %s"
                                     % (self.ckpt, self.opts, rc, msg[:300]))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def cleanup_mounts():
    for m in list(Mount.active):
        try:
            subprocess.run(["fusermount3", "-u", "-z", m.mnt], check=False,
                           stderr=subprocess.DEVNULL)
            if m.p and m.p.poll() is None:
                m.p.terminate()
                m.p.wait(timeout=10)
        except Exception:
            pass
    Mount.active.clear()


# ---------------------------------------------------------------------------
# page cache


def disk_stats(path):
    """/proc/diskstats of the block device holding path: reads completed,
    sectors read, ms spent reading (whole disk, partitions included)."""
    dev = os.stat(path).st_dev
    name = None
    try:
        name = os.path.basename(os.path.realpath("/sys/dev/block/%d:%d" % (
            os.major(dev), os.minor(dev))))
    except OSError:
        pass
    with open("/proc/diskstats") as f:
        for line in f:
            x = line.split()
            if x[2] == name:
                return dict(reads=int(x[3]), sectors=int(x[5]), read_ms=int(x[6]))
    return {}


def disk_delta(a, b):
    if not a or not b:
        return {}
    d = {k: b[k] - a[k] for k in a}
    d["bytes"] = d["sectors"] * 512
    d["avg_io_kib"] = d["bytes"] / 1024 / d["reads"] if d["reads"] else 0
    return d


def resident_bytes(paths):
    """Bytes of paths in the page cache (fincore), or None."""
    if not shutil.which("fincore"):
        return None
    r = subprocess.run(["fincore", "-b", "-n", "-o", "RES"] + list(paths),
                       capture_output=True, text=True)
    if r.returncode:
        return None
    return sum(int(x) for x in r.stdout.split())


def warm(paths):
    readers.seq_read(paths)


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def prime_memory(ctx, nbytes):
    """Touch nbytes of fresh anonymous memory and free it, right before a
    measured process, so that the memory it allocates is memory the
    machine used a moment ago.  On a VM with free page reporting
    (virtio-balloon; this one reports free 2 MiB blocks to the host about
    2 s after they are freed) memory that sat free is handed back to the
    host, and the next first touch of it costs a host fault: a TP4 load
    into fresh arrays measured 0.5 s right after another run and 1.8-2.8 s
    after a 10 s pause, torch and flexfs alike.  Priming measures every
    reader in the first state, which is what a machine without a balloon
    always has.  -> seconds the priming took (large when the memory had
    gone back to the host)."""
    if not ctx.prime or nbytes <= 0:
        return 0.0
    import numpy as np
    nbytes = int(min(nbytes, mem_available() - 2 * 2**30))
    if nbytes <= 0:
        return 0.0
    t0 = time.monotonic()
    a = np.empty(nbytes, np.uint8)
    a[::4096] = 1
    del a
    return time.monotonic() - t0


def evict(ctx, paths, method=None):
    """Drop the page cache: all of it (drop_caches) in full mode when
    permitted, else (or with method "fadvise") just these files (fadvise
    DONTNEED).  -> residency."""
    os.sync()
    if (method or ctx.drop) == "drop_caches":
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    else:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return resident_bytes(paths)


def pick_drop_method(ctx):
    """drop_caches if writable and effective (checked on a probe file with
    fincore), else fadvise(DONTNEED) of the backing files."""
    if ctx.args.quick or ctx.args.evict == "fadvise":
        return "fadvise", "fadvise(POSIX_FADV_DONTNEED) of the backing files"
    probe = os.path.join(ctx.workdir, ".evict-probe")
    with open(probe, "wb") as f:
        f.write(os.urandom(4 * MiB))
    warm([probe])
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        res = resident_bytes([probe])
        if res in (0, None):
            return "drop_caches", ("sync; echo 3 > /proc/sys/vm/drop_caches (probe file: %s)"
                                   % ("0 bytes resident after" if res == 0 else "not checked"))
        why = "drop_caches left %d bytes resident" % res
    except OSError as e:
        why = "drop_caches not permitted (%s)" % e
    finally:
        os.remove(probe)
    return "fadvise", why + "; using fadvise(POSIX_FADV_DONTNEED) of the backing files"


# ---------------------------------------------------------------------------
# checkpoints


def scripts_dir(ctx):
    """Copies of the generator/loader scripts in the work dir (so that the
    trixie chroot can run them through the bind mount)."""
    d = os.path.join(ctx.workdir, "scripts")
    os.makedirs(d, exist_ok=True)
    for n in ("model.py", "gen_ckpt.py", "torch_load.py", "readers.py", "loaders.py"):
        shutil.copy2(os.path.join(HERE, n), d)
    shutil.copy2(os.path.join(REPO, "tools", "fixtures", "gen_dcp.py"), d)
    return d


class Chroot:
    """The work dir bind-mounted into the torch 2.6 chroot."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.inner = "/tmp/flexfs-bench.%d" % os.getpid()
        self.outer = CHROOT + self.inner
        self.bound = False

    def __enter__(self):
        os.makedirs(self.outer, exist_ok=True)
        subprocess.run(["mount", "--bind", self.ctx.workdir, self.outer], check=True)
        self.bound = True
        atexit.register(self.__exit__)
        return self

    def __exit__(self, *exc):
        if self.bound:
            subprocess.run(["umount", self.outer], check=False)
            self.bound = False
            try:
                os.rmdir(self.outer)
            except OSError:
                pass

    def path(self, outer_path):
        rel = os.path.relpath(outer_path, self.ctx.workdir)
        return self.inner + "/" + rel

    def cmd(self, script, *args):
        return ["chroot", CHROOT, "python3", self.path(os.path.join(self.ctx.scripts, script))] \
            + list(args)


def ckpt_key(preset, layers, layout, limit, tag):
    return "%s-%s-%dL-%s%s" % (tag, preset, layers, layout, "-%dT" % limit if limit else "")


def ensure_ckpt(ctx, tag, preset, size=None, layers=None, layout="tp2pp1", limit=None,
                full_check=False):
    """The cached checkpoint, generated when missing.  tag: t113 | t26."""
    c = model.config(preset, size, layers)
    d = os.path.join(ctx.workdir, ckpt_key(preset, c["layers"], layout, limit, tag))
    stamp = os.path.join(d, "bench-ckpt.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            info = json.load(f)
        if info["config"] == c and info.get("layout") == layout and \
                info.get("tensors_limit") == limit and info["seed"] == model.SEED:
            log("reusing %s (torch %s)" % (d, info["torch"]))
            info["dir"] = d
            return info
    args = ["--out", d, "--preset", preset, "--layers", str(c["layers"]),
            "--layout", layout] + (["--tensors", str(limit)] if limit else []) + \
        (["--full-check"] if full_check else [])
    log("generating %s (%s, %d layers, %.2f GiB) with torch %s" % (
        d, preset, c["layers"], c["bytes"] / 2 ** 30, "2.6" if tag == "t26" else "1.13"))
    if tag == "t26":
        cmd = ctx.chroot.cmd("gen_ckpt.py", *[ctx.chroot.path(a) if a == d else a for a in args])
    else:
        cmd = [PY, os.path.join(ctx.scripts, "gen_ckpt.py")] + args
    return run_generator(cmd, d, stamp)


def run_generator(cmd, d, stamp):
    """Run a gen_ckpt.py command that writes checkpoint d and, last, its
    stamp; return the stamp's info with "dir" set."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("generator failed:\n%s%s" % (r.stdout, r.stderr))
    log(r.stdout.strip())
    with open(stamp) as f:
        info = json.load(f)
    info["dir"] = d
    return info


def ensure_transposed(ctx, n, full_check=False):
    """The cached checkpoint of transposed weights (model.transposed_config,
    base dimension n), written by torch 1.13 when missing."""
    c = model.transposed_config(n)
    d = os.path.join(ctx.workdir, "t113-transposed-n%d" % n)
    stamp = os.path.join(d, "bench-ckpt.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            info = json.load(f)
        if info["config"] == c and info["seed"] == model.SEED:
            log("reusing %s (torch %s)" % (d, info["torch"]))
            info["dir"] = d
            return info
    log("generating %s (transposed weights, %.1f MiB) with torch 1.13" % (d, c["bytes"] / MiB))
    return run_generator([PY, os.path.join(ctx.scripts, "gen_ckpt.py"), "--out", d,
                          "--transposed", str(n)] + (["--full-check"] if full_check else []),
                         d, stamp)


def distcp_files(ckpt):
    return sorted(os.path.join(ckpt, n) for n in os.listdir(ckpt) if n.endswith(".distcp"))


def backing_files(ckpt):
    return distcp_files(ckpt) + [os.path.join(ckpt, ".metadata")]


# ---------------------------------------------------------------------------
# results


class Row:
    def __init__(self, fig, name, unit, baseline_desc, goal, better="higher", note="",
                 ratio_unit=None):
        self.fig, self.name, self.unit, self.goal, self.better = fig, name, unit, goal, better
        self.ratio_unit = ratio_unit
        self.baseline_desc, self.note = baseline_desc, note
        self.base, self.flex, self.ratio = [], [], []

    def add(self, base, flex, ratio):
        if base is not None:
            self.base.append(base)
        if flex is not None:
            self.flex.append(flex)
        if ratio is not None:
            self.ratio.append(ratio)

    def verdict(self):
        if self.goal is None or not self.ratio:
            return "-"
        m = median(self.ratio)
        ok = m >= self.goal if self.better == "higher" else m <= self.goal
        return "pass" if ok else "MISS"

    def doc(self):
        return dict(figure=self.fig, name=self.name, unit=self.unit,
                    baseline_desc=self.baseline_desc, baseline=self.base, flexfs=self.flex,
                    ratio=self.ratio, ratio_median=median(self.ratio) if self.ratio else None,
                    ratio_min=min(self.ratio) if self.ratio else None,
                    ratio_max=max(self.ratio) if self.ratio else None,
                    goal=self.goal, goal_kind=">=" if self.better == "higher" else "<=",
                    verdict=self.verdict(), note=self.note)


def fmt(v, unit):
    if v is None or v != v:
        return "-"
    if unit == "GB/s":
        return "%.2f GB/s" % (v / GB)
    if unit == "s":
        return "%.2f s" % v
    if unit == "ms":
        return "%.0f ms" % (v * 1e3) if v >= 0.01 else "%.1f ms" % (v * 1e3)
    if unit == "MiB":
        return "%.1f MiB" % (v / MiB)
    if unit == "x":
        return "%.3f" % v
    return "%.3g" % v


def table(rows):
    out = []
    hdr = ("figure", "baseline", "flexfs", "ratio median [min, max]", "goal", "result")
    lines = []
    for r in rows:
        base = ("%s %s" % (r.baseline_desc, fmt(median(r.base), r.unit))).strip() \
            if r.base else r.baseline_desc or "-"
        flex = fmt(median(r.flex), r.unit) if r.flex else "-"
        val = r.ratio_unit  # rows whose "ratio" is the value itself
        f = (lambda v: fmt(v, val)) if val else (lambda v: "%.3g" % v)
        if r.ratio:
            rat = "%s [%s, %s]" % (f(median(r.ratio)), f(min(r.ratio)), f(max(r.ratio)))
        else:
            rat = "-"
        goal = "-" if r.goal is None else ("%s %s" % (">=" if r.better == "higher" else "<=",
                                                      f(r.goal)))
        lines.append((r.name, base, flex, rat, goal, r.verdict()))
    w = [max(len(x[i]) for x in lines + [hdr]) for i in range(len(hdr))]
    sep = "+".join("-" * (n + 2) for n in w)
    out.append(" | ".join(h.ljust(n) for h, n in zip(hdr, w)))
    out.append(sep)
    for x in lines:
        out.append(" | ".join(v.ljust(n) for v, n in zip(x, w)))
    return "\n".join(out)


# ---------------------------------------------------------------------------
# figures


def tput(nbytes, secs):
    return nbytes / secs if secs > 0 else float("nan")


def view_files(m, tp, pp=1):
    return [m.path("ranks", "tp%02d_pp%02d" % (r, s), "model.safetensors")
            for s in range(pp) for r in range(tp)]


def hf_files(m):
    d = m.path("hf")
    return sorted(os.path.join(d, n) for n in os.listdir(d)
                  if n.endswith(".safetensors") or n.endswith(".index.json"))


def record_check(ctx, what, res):
    ctx.checks[what] = res
    if not res.get("ok", False):
        ctx.problems.append("byte check failed: %s: %s" % (what, res.get("errors")))
    log("check %s: %s (%d tensors, %.1f MB compared)" % (
        what, "ok" if res.get("ok") else "FAILED", res.get("tensors_checked", 0),
        res.get("bytes_checked", 0) / 1e6))


def diag_pass(ctx, info, opts, reader, cold=False):
    """One extra, untimed read for the diagnostics: exact FUSE request and
    daemon syscall counts (Counters), /proc/<daemon> deltas, disk I/O.
    reader(mount) -> (bytes delivered, seconds)."""
    ck = info["dir"]
    if cold:
        evict(ctx, backing_files(ck))
    else:
        warm(backing_files(ck))
    with Mount(ctx, ck, opts, name="diag") as m:
        with Counters(ctx, m) as c:
            s0, k0 = m.stats(), disk_stats(ck)
            n, t = reader(m)
            s1, k1 = m.stats(), disk_stats(ck)
    return dict(opts=opts, cold=cold, bytes=n, seconds=t, gbps=n / t / GB if t else None,
                counters=c.summary(n), daemon=delta(s0, s1), disk=disk_delta(k0, k1))


def dio_variant(dio):
    """(extra mount options, label suffix, figure key suffix) of a figure
    measured without or with -o direct_io."""
    return (",direct_io", " [direct_io]", "_dio") if dio else ("", "", "")


def fig_contig(ctx, info, dio=False):
    ck = info["dir"]
    files = distcp_files(ck)
    mo, sfx, key = dio_variant(dio)
    opts = "tp=2" + mo
    rows = [Row("contig" + key, "contiguous TP2->TP2, (a) first read" + sfx, "GB/s",
                "distcp warm", 0.5),
            Row("contig" + key, "contiguous TP2->TP2, (b) re-read" + sfx, "GB/s",
                "distcp warm", 0.9),
            Row("contig" + key, "contiguous TP2->TP2, (c) cold" + sfx, "GB/s",
                "distcp cold", 0.9)]
    diag = []
    for i in range(ctx.runs):
        warm(backing_files(ck))
        nb, tb = readers.seq_read(files)
        with Mount(ctx, ck, opts) as m:
            vf = view_files(m, 2)
            s0 = m.stats()
            nf, tf = readers.seq_read(vf)
            s1 = m.stats()
            rows[0].add(tput(nb, tb), tput(nf, tf), tput(nf, tf) / tput(nb, tb))
            nf2, tf2 = readers.seq_read(vf)
            s2 = m.stats()
            nb2, tb2 = readers.seq_read(files)
            rows[1].add(tput(nb2, tb2), tput(nf2, tf2), tput(nf2, tf2) / tput(nb2, tb2))
            if i == 0 and ctx.check != "none":
                record_check(ctx, "ranks/*/model.safetensors " + opts,
                             check_views(ctx, info, vf, 2))
        res_b = evict(ctx, backing_files(ck))
        k0 = disk_stats(ck)
        nbc, tbc = readers.seq_read(files)
        k1 = disk_stats(ck)
        res_f = evict(ctx, backing_files(ck))
        with Mount(ctx, ck, opts) as m:
            s3 = m.stats()
            k2 = disk_stats(ck)
            nfc, tfc = readers.seq_read(view_files(m, 2))
            k3 = disk_stats(ck)
            s4 = m.stats()
        rows[2].add(tput(nbc, tbc), tput(nfc, tfc), tput(nfc, tfc) / tput(nbc, tbc))
        diag.append(dict(first=delta(s0, s1), reread=delta(s1, s2), cold=delta(s3, s4),
                         bytes=dict(distcp=nb, views=nf),
                         disk_cold=dict(baseline=disk_delta(k0, k1), flexfs=disk_delta(k2, k3)),
                         resident_after_evict=dict(before_baseline=res_b, before_flexfs=res_f)))
        log("contig%s run %d: a %.2f/%.2f  b %.2f/%.2f  c %.2f/%.2f GB/s (flexfs/distcp)" % (
            sfx, i, nf / tf / GB, nb / tb / GB, nf2 / tf2 / GB, nb2 / tb2 / GB,
            nfc / tfc / GB, nbc / tbc / GB))
    ctx.diag["contig" + key] = dict(runs=diag, passes=[
        diag_pass(ctx, info, opts, lambda m: readers.seq_read(view_files(m, 2))),
        diag_pass(ctx, info, opts, lambda m: readers.seq_read(view_files(m, 2)), cold=True)])
    return rows


def check_views(ctx, info, files, tp):
    """Byte check of ranks/tpRR_pp00/model.safetensors files of a TP-tp view."""
    truth = ctx.truth(info)
    errs, out = [], dict(ok=True, tensors_checked=0, bytes_checked=0, files=len(files))
    for r, p in enumerate(files):
        res = readers.check_st_files(truth, [p], lambda n, r=r: truth.shard(n, tp, r),
                                     ctx.check)
        if res["names"] != len(truth.spec):
            res["ok"] = False
            res["errors"].append("%s: %d tensors, want %d" % (p, res["names"], len(truth.spec)))
        out["ok"] &= res["ok"]
        out["tensors_checked"] += res["tensors_checked"]
        out["bytes_checked"] += res["bytes_checked"]
        errs += res["errors"]
    out["errors"] = errs[:20]
    return out


def check_hf(ctx, info, m):
    truth = ctx.truth(info)
    files = [p for p in hf_files(m) if p.endswith(".safetensors")]
    res = readers.check_st_files(truth, files, truth.full, ctx.check)
    if res["names"] != len(truth.spec):
        res["ok"] = False
        res["errors"].append("hf/: %d tensors, want %d" % (res["names"], len(truth.spec)))
    idx = m.path("hf", "model.safetensors.index.json")
    if len(files) > 1:
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        if sorted(wm) != sorted(truth.spec) or \
                sorted(set(wm.values())) != sorted(os.path.basename(p) for p in files):
            res["ok"] = False
            res["errors"].append("hf/model.safetensors.index.json weight_map is wrong")
    res["hf_files"] = [os.path.basename(p) for p in files]
    return res


def fig_strided(ctx, info, dio=False):
    ck = info["dir"]
    files = distcp_files(ck)
    mo, sfx, key = dio_variant(dio)
    opts = "tp=1" + (",hf_shard_size=%s" % ctx.hf_shard if ctx.hf_shard else "") + mo
    row = Row("strided" + key, "strided hf/ (TP1) of TP2, first read" + sfx, "GB/s",
              "distcp warm", 0.35)
    diag = []
    for i in range(ctx.runs):
        warm(backing_files(ck))
        nb, tb = readers.seq_read(files)
        with Mount(ctx, ck, opts) as m:
            s0 = m.stats()
            nf, tf = readers.seq_read(hf_files(m))
            s1 = m.stats()
            if i == 0 and ctx.check != "none":
                record_check(ctx, "hf/ (tp=1 mount, %s)" % opts, check_hf(ctx, info, m))
        row.add(tput(nb, tb), tput(nf, tf), tput(nf, tf) / tput(nb, tb))
        diag.append(dict(read=delta(s0, s1), bytes=nf))
        log("strided%s run %d: %.2f / %.2f GB/s (flexfs/distcp)" % (
            sfx, i, nf / tf / GB, nb / tb / GB))
    # where the time goes: the same file read tensor group by tensor group
    warm(backing_files(ck))
    with Mount(ctx, ck, opts) as m:
        groups = {}
        for p in hf_files(m):
            if not p.endswith(".safetensors"):
                continue
            with open(p, "rb") as f:
                hdr, _meta, base = readers.st_header(f)
            for n, e in hdr.items():
                kind = ("row-parallel (wo, w2: source split on dim 1)"
                        if n.endswith(("attention.wo.weight", "feed_forward.w2.weight"))
                        else "dim-0 split or replicated")
                b, en = e["data_offsets"]
                groups.setdefault(kind, []).append((p, base + b, en - b))
        per = {}
        for kind, rng in sorted(groups.items()):
            rng.sort(key=lambda x: (x[0], x[1]))
            s0 = m.stats()
            n, t = readers.seq_read(None, ranges=rng)
            s1 = m.stats()
            per[kind] = dict(bytes=n, seconds=t, gbps=n / t / GB, daemon=delta(s0, s1))
            log("strided breakdown: %s: %.2f GB/s" % (kind, n / t / GB))
        for kind, rng in sorted(groups.items()):  # the same again, counted (untimed)
            m.stop()
            warm(backing_files(ck))
            m.start()
            with Counters(ctx, m) as c:
                n, t = readers.seq_read(None, ranges=rng)
            per[kind]["counters"] = c.summary(n)
    ctx.diag["strided" + key] = dict(runs=diag, by_kind=per)
    return [row]


# the daemon's mount-time warning of a transposed chunk larger than cache_size=
GATHER_WARNING = re.compile(r"saved with a strided innermost axis")


def fig_transposed(ctx, info):
    """Strided gathers (chunks saved with a strided innermost axis): first
    read of every view file on a fresh mount, backing files page-cached,
    vs sequential 1 MiB reads of those backing files just before."""
    ck = info["dir"]
    files = distcp_files(ck)
    hf = lambda m: [p for p in hf_files(m) if p.endswith(".safetensors")]  # noqa: E731
    cases = [  # (key, mount options, row label, goal, view files, tp of the check)
        ("default", "tp=1", "transposed hf/ (TP1), first read, default cache", 0.35, hf, 1),
        ("nocache", "tp=1,cache_size=0", "transposed hf/ (TP1), first read, cache_size=0",
         None, hf, 1),
        ("tp2", "tp=2", "transposed ranks/*/ (TP2), first read, default cache", None,
         lambda m: view_files(m, 2), 2),
    ]
    note = ("%d bf16 tensors (%.0f MiB) saved by torch %s as w.t(), items with stride "
            "(1, rows); ratio = flexfs / backing throughput"
            % (info["n_tensors"], info["data_bytes"] / MiB, info["torch"]))
    rows = {k: Row("transposed", label, "GB/s", "distcp warm", goal, note=note)
            for k, _o, label, goal, _f, _t in cases}
    diag = {k: [] for k in rows}
    warnings = {}
    for i in range(ctx.runs):
        for key, opts, _label, _goal, view, tp in cases:
            warm(backing_files(ck))
            nb, tb = readers.seq_read(files)
            with Mount(ctx, ck, opts, name="tr", stderr_ok=GATHER_WARNING) as m:
                s0 = m.stats()
                nf, tf = readers.seq_read(view(m))
                s1 = m.stats()
                if i == 0 and ctx.check != "none":
                    what = "transposed %s (-o %s)" % ("hf/" if tp == 1 else "ranks/*/", opts)
                    if tp == 1:
                        record_check(ctx, what, check_hf(ctx, info, m))
                    else:
                        record_check(ctx, what, check_views(ctx, info, view(m), tp))
            if m.warnings:
                warnings[opts] = m.warnings
            rows[key].add(tput(nb, tb), tput(nf, tf), tput(nf, tf) / tput(nb, tb))
            d = delta(s0, s1)
            diag[key].append(dict(bytes=nf, seconds=tf, baseline=dict(bytes=nb, seconds=tb),
                                  daemon=d, rchar_per_delivered=d.get("rchar", 0) / nf,
                                  VmHWM=s1.get("VmHWM")))
            log("transposed run %d -o %s: %.3f s, %.2f / %.2f GB/s (flexfs/distcp); daemon "
                "read %.2f bytes per byte delivered, cpu %.2f s, VmHWM %.0f MiB"
                % (i, opts, tf, nf / tf / GB, nb / tb / GB, d.get("rchar", 0) / nf,
                   d["cpu_s"], (s1.get("VmHWM") or 0) / MiB))
    ctx.diag["transposed"] = dict(runs=diag, warnings=warnings)
    return [rows[k] for k, *_ in cases]


def h2d_bandwidth(nbytes=256 * MiB, reps=5):
    """Host-to-device bytes/s of the CUDA runtime: synchronous copies of
    nbytes of pinned memory, the best of reps; None without libcudart."""
    import ctypes
    rt = None
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            rt = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if rt is None:
        return None
    host, dev = ctypes.c_void_p(), ctypes.c_void_p()
    if rt.cudaMallocHost(ctypes.byref(host), ctypes.c_size_t(nbytes)) != 0:
        return None
    try:
        if rt.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(nbytes)) != 0:
            return None
        best = None
        for _ in range(reps):
            t0 = time.perf_counter()
            if rt.cudaMemcpy(dev, host, ctypes.c_size_t(nbytes), 1) != 0:  # HostToDevice
                return None
            rt.cudaDeviceSynchronize()
            t = time.perf_counter() - t0
            best = t if best is None or t < best else best
        rt.cudaFree(dev)
        return nbytes / best
    finally:
        rt.cudaFreeHost(host)


def fig_gpu(ctx, info):
    """Transposed gathers on the CUDA backend vs the CPU backend, same run;
    and the GPU's gather throughput vs its host-to-device bandwidth."""
    ck = info["dir"]
    hf = lambda m: [p for p in hf_files(m) if p.endswith(".safetensors")]  # noqa: E731
    gpu_opts, cpu_opts = "tp=1,gpu=on,gpu_min=0", "tp=1,gpu=off"
    def_opts = "tp=1,gpu=on"  # the default gpu_min
    try:
        with Mount(ctx, ck, gpu_opts, name="gpu", stderr_ok=GPU_LINES) as m:
            pass
        device = "; ".join(w for w in m.warnings if "slicer:" in w)
    except RuntimeError as e:
        log("gpu: skipped, -o gpu=on does not mount here: %s" % e)
        ctx.diag["gpu"] = dict(skipped=str(e))
        return []
    h2d = h2d_bandwidth()
    note = ("%s; %d bf16 tensors saved as w.t(); ratio = GPU / CPU backend throughput"
            % (device, info["n_tensors"]))
    vs_cpu = Row("gpu", "transposed hf/ (TP1), GPU backend vs CPU backend", "GB/s",
                 "cpu backend", 5.0, note=note)
    vs_def = Row("gpu", "transposed hf/ (TP1), GPU backend at the default gpu_min vs CPU",
                 "GB/s", "cpu backend", None, note="-o gpu=on: what a mount gets unset")
    vs_h2d = Row("gpu", "transposed hf/ (TP1), GPU gathers vs host-to-device bandwidth",
                 "GB/s", "cudaMemcpy H2D pinned", 0.6,
                 note="H2D %.2f GB/s" % (h2d / GB) if h2d else "H2D not measured")
    diag = []
    for i in range(ctx.runs):
        got = {}
        for opts in (cpu_opts, gpu_opts, def_opts):
            warm(backing_files(ck))
            with Mount(ctx, ck, opts, name="gpu", stderr_ok=GPU_LINES) as m:
                nf, tf = readers.seq_read(hf(m))
                if i == 0 and ctx.check != "none" and opts != def_opts:
                    record_check(ctx, "transposed hf/ (-o %s)" % opts, check_hf(ctx, info, m))
            got[opts] = tput(nf, tf)
        vs_cpu.add(got[cpu_opts], got[gpu_opts], got[gpu_opts] / got[cpu_opts])
        vs_def.add(got[cpu_opts], got[def_opts], got[def_opts] / got[cpu_opts])
        if h2d:
            vs_h2d.add(h2d, got[gpu_opts], got[gpu_opts] / h2d)
        diag.append(dict(cpu=got[cpu_opts], gpu=got[gpu_opts], gpu_default=got[def_opts],
                         h2d=h2d))
        log("gpu run %d: gpu %.2f GB/s (default gpu_min %.2f), cpu %.2f GB/s, h2d %s"
            % (i, got[gpu_opts] / GB, got[def_opts] / GB, got[cpu_opts] / GB,
               "%.2f GB/s" % (h2d / GB) if h2d else "-"))
    ctx.diag["gpu"] = dict(runs=diag, device=device)
    return [vs_cpu, vs_def] + ([vs_h2d] if h2d else []) + fig_gpu_cast(ctx, info, device)


def files_digest(paths):
    h = hashlib.sha256()
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                h.update(b)
                n += len(b)
    return h.hexdigest(), n


def fig_gpu_cast(ctx, info, device):
    """The same tensors cast to float32 by the rules (AOA dtype=): gathered
    and converted in one pass by the CUDA backend vs gathered then
    converted on the CPU, same run.  The GPU's bytes must be the CPU's
    (whose conversions cast.c's tests check against torch)."""
    ck = info["dir"]
    names = [t[0] for t in info["config"]["tensors"]]
    rules = os.path.join(ctx.workdir, "gpu-cast-f32.json")
    with open(rules, "w") as f:
        json.dump({"aoa_statements": ["%s -> %s, dtype='float32'" % (n, n) for n in names]}, f)
    hf = lambda m: [p for p in hf_files(m) if p.endswith(".safetensors")]  # noqa: E731
    gpu_opts = "tp=1,gpu=on,gpu_min=0,rules=" + rules
    cpu_opts = "tp=1,gpu=off,rules=" + rules
    row = Row("gpu", "transposed hf/ (TP1) cast bf16 -> f32, GPU backend vs CPU backend",
              "GB/s", "cpu backend", None,
              note="%s; GB/s of float32 delivered; ratio = GPU / CPU" % device)
    diag = []
    for i in range(ctx.runs):
        got, digest = {}, {}
        for opts in (cpu_opts, gpu_opts):
            warm(backing_files(ck))
            with Mount(ctx, ck, opts, name="gpu", stderr_ok=GPU_LINES) as m:
                nf, tf = readers.seq_read(hf(m))
                if i == 0 and ctx.check != "none":
                    digest[opts] = files_digest(hf(m))
            got[opts] = tput(nf, tf)
        if digest:
            same = digest[cpu_opts] == digest[gpu_opts]
            record_check(ctx, "cast hf/ GPU bytes == CPU bytes",
                         dict(ok=same, tensors_checked=len(names),
                              bytes_checked=digest[gpu_opts][1],
                              errors=[] if same else ["sha256 %s (gpu) != %s (cpu)" % (
                                  digest[gpu_opts][0], digest[cpu_opts][0])]))
        row.add(got[cpu_opts], got[gpu_opts], got[gpu_opts] / got[cpu_opts])
        diag.append(dict(cpu=got[cpu_opts], gpu=got[gpu_opts]))
        log("gpu cast run %d: gpu %.2f GB/s, cpu %.2f GB/s"
            % (i, got[gpu_opts] / GB, got[cpu_opts] / GB))
    ctx.diag["gpu_cast"] = dict(runs=diag)
    return [row]


# the daemon's line naming its slicer, and the gather warning
GPU_LINES = re.compile(r"slicer: cuda on |saved with a strided innermost axis")


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode,
                                                      r.stdout[-2000:], r.stderr[-4000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def fig_e2e(ctx, info, tag):
    ck = info["dir"]
    tp = 4
    tv = "2.6" if tag == "t26" else "1.13"
    rows = {
        "npy": Row("e2e", "e2e TP4 vs torch %s DCP load (npy mmap)" % tv, "s",
                   "torch %s" % tv, 5.0, note="ratio = torch time / flexfs time"),
        "st": Row("e2e", "e2e TP4 vs torch %s DCP load (safetensors read)" % tv, "s",
                  "torch %s" % tv, 5.0, note="ratio = torch time / flexfs time"),
        "st_dio": Row("e2e", "e2e TP4 vs torch %s DCP load (safetensors read) [direct_io]"
                      % tv, "s", "torch %s" % tv, 5.0,
                      note="ratio = torch time / flexfs time; mounted -o direct_io"),
    }
    # reader mode and mount options of each flexfs variant
    variants = (("npy", "npy", ""), ("st", "st", ""), ("st_dio", "st", ",direct_io"))
    byt = {
        "npy": Row("e2e", "backing bytes read / delivered, TP4 npy, cold", "x", "",
                   1.05, better="lower", ratio_unit="x",
                   note="daemon read_bytes (storage reads it caused) / bytes delivered, one "
                        "cold pass: page cache dropped, fresh mount, every TP4 tensor read"),
        "st": Row("e2e", "backing bytes read / delivered, TP4 safetensors, cold", "x", "",
                  1.05, better="lower", ratio_unit="x",
                  note="daemon read_bytes (storage reads it caused) / bytes delivered, one "
                       "cold pass: page cache dropped, fresh mount, every TP4 tensor read"),
    }
    floor = Row("e2e", "TP4 read floor: plain page-cached files -> fresh arrays (%s ckpt)" % tv,
                "s", "floor", None, note="ratio = floor time / flexfs (safetensors) time: the "
                "share of the flexfs time any reader pays on this machine")
    diag = []
    # a reader needs fresh memory for its arrays, and for the views' page
    # cache when it reads through it; torch more for whole saved chunks
    prime_n = 3 * info["config"]["bytes"] + 2**30
    for i in range(ctx.runs):
        chk = ctx.check if i == 0 else "none"
        warm(backing_files(ck))
        if tag == "t26":
            cmd = ctx.chroot.cmd("torch_load.py", "--ckpt", ctx.chroot.path(ck),
                                 "--tp", str(tp), "--check", chk)
        else:
            cmd = [PY, os.path.join(ctx.scripts, "torch_load.py"), "--ckpt", ck,
                   "--tp", str(tp), "--check", chk]
        primed = [prime_memory(ctx, prime_n)]
        tr = run_json(cmd)
        if chk != "none":
            record_check(ctx, "torch %s DCP load TP4 vs ground truth" % tv, tr["check"])
        d = dict(torch=dict(seconds=tr["seconds"], per_rank=tr["per_rank"], bytes=tr["bytes"],
                            io=tr.get("io")))
        warm(backing_files(ck))
        primed.append(prime_memory(ctx, prime_n))
        fl = run_json([PY, os.path.join(HERE, "readers.py"), "e2e", "--mode", "floor",
                       "--info", os.path.join(ck, "bench-ckpt.json"), "--tp", str(tp),
                       "--src"] + distcp_files(ck))
        d["floor"] = dict(seconds=fl["seconds"], per_rank=fl["per_rank"], bytes=fl["bytes"])
        for var, mode, mo in variants:
            warm(backing_files(ck))
            with Mount(ctx, ck, "tp=%d%s" % (tp, mo), name="e2e") as m:
                primed.append(prime_memory(ctx, prime_n))
                s0 = m.stats()
                fr = run_json([PY, os.path.join(HERE, "readers.py"), "e2e", "--mnt", m.mnt,
                               "--info", os.path.join(ck, "bench-ckpt.json"), "--tp", str(tp),
                               "--mode", mode, "--check", chk])
                s1 = m.stats()
            if chk != "none":
                record_check(ctx, "flexfs TP4 %s (%s ckpt) vs ground truth" % (var, tv),
                             fr["check"])
            total = m.latency + fr["seconds"]
            dd = delta(s0, s1)
            dd["rchar_per_delivered"] = dd["rchar"] / fr["bytes"]
            rows[var].add(tr["seconds"], total, tr["seconds"] / total)
            if var == "st":
                floor.add(fl["seconds"], total, fl["seconds"] / total)
            d[var] = dict(mount_s=m.latency, read_s=fr["seconds"], per_rank=fr["per_rank"],
                          bytes=fr["bytes"], daemon=dd)
            log("e2e %s run %d %s: torch %.2f s, flexfs %.2f s (mount %.3f + read %.2f), "
                "floor %.2f s, rchar/delivered %.4f (warm; splice replies are not in rchar)" % (
                    tv, i, var, tr["seconds"], total, m.latency, fr["seconds"], fl["seconds"],
                    dd["rchar"] / fr["bytes"]))
        d["primed_s"] = primed
        log("e2e %s run %d: memory primed before each process in %s s" % (
            tv, i, " ".join("%.2f" % x for x in primed)))
        diag.append(d)
    if tag == "t113":
        def e2e_reader(mode):
            def rd(m):
                r = run_json([PY, os.path.join(HERE, "readers.py"), "e2e", "--mnt", m.mnt,
                              "--info", os.path.join(ck, "bench-ckpt.json"), "--tp", str(tp),
                              "--mode", mode])
                return r["bytes"], r["seconds"]
            return rd
        passes = {}
        for mode in ("npy", "st"):
            passes[mode] = diag_pass(ctx, info, "tp=%d" % tp, e2e_reader(mode))
            c = passes[mode + "_cold"] = diag_pass(ctx, info, "tp=%d" % tp, e2e_reader(mode),
                                                  cold=True)
            x = c["daemon"].get("read_bytes", 0) / c["bytes"]
            byt[mode].add(None, x, x)
            log("e2e cold pass %s: daemon read_bytes %.3f GB for %.3f GB delivered (%.4f); "
                "disk %s" % (mode, c["daemon"].get("read_bytes", 0) / GB, c["bytes"] / GB, x,
                             c["disk"]))
        diag = dict(runs=diag, passes=passes)
    ctx.diag["e2e_" + tag] = diag
    out = [rows["npy"], rows["st"], rows["st_dio"], floor]
    return out + ([byt["npy"], byt["st"]] if tag == "t113" else [])


def fig_mount(ctx, many, big):
    rows, extra = [], []
    diag = {}
    cases = [("tp=1", "warm", many), ("tp=8,pp=8", "warm", many), ("tp=1", "cold", many),
             ("tp=4", "warm", big)]
    for opts, cache, info in cases:
        n = info["n_tensors"]
        label = "mount latency, %d tensors/%d ranks -o %s (%s)" % (n, info["world"], opts, cache)
        r = Row("mount", label, "ms", "", 0.100, better="lower", ratio_unit="ms",
                note="exec of flexfs to the first byte of index.json (no baseline)")
        dd = []
        for i in range(ctx.runs):
            if cache == "warm":
                warm(backing_files(info["dir"]))
            else:
                evict(ctx, backing_files(info["dir"]))
            with Mount(ctx, info["dir"], opts, name="lat") as m:
                st = m.at_mount
                size = os.path.getsize(m.path("index.json"))
            r.add(None, m.latency, m.latency)
            dd.append(dict(latency_s=m.latency, cpu_s=st.get("utime", 0) + st.get("stime", 0),
                           VmHWM=st.get("VmHWM"), syscr=st.get("syscr"), rchar=st.get("rchar"),
                           index_json_bytes=size))
            log("mount %s run %d: %.0f ms (daemon cpu %.2f s, VmHWM %.0f MiB, %d read calls)"
                % (label, i, m.latency * 1e3, dd[-1]["cpu_s"], (st.get("VmHWM") or 0) / MiB,
                   st.get("syscr") or 0))
        diag[label] = dd
        rows.append(r)
        if info is many and cache == "warm":
            rr = Row("memory", "peak RSS of the daemon after mounting %d tensors -o %s"
                     % (n, opts), "MiB", "", 64 * MiB, better="lower", ratio_unit="MiB",
                     note="VmHWM when index.json is first readable")
            for x in dd:
                rr.add(None, x["VmHWM"], x["VmHWM"])
            extra.append(rr)
    ctx.diag["mount"] = diag
    return rows + extra


def find_inspect(ctx):
    for p in (os.environ.get("FLEXFS_INSPECT"),
              os.path.join(os.path.dirname(os.path.dirname(ctx.flexfs)), "tools",
                           "flexfs-inspect")):
        if p and os.access(p, os.X_OK):
            return os.path.abspath(p)
    return None


def ensure_digest_input(ctx, nbytes):
    """A directory holding model.safetensors with one float32 tensor "w" of
    nbytes random bytes, and the same bytes alone in a file beside it.
    @return (checkpoint dir, raw file)."""
    d = os.path.join(ctx.workdir, "digest-%d" % nbytes)
    st, raw = os.path.join(d, "ckpt", "model.safetensors"), os.path.join(d, "raw.bin")
    if os.path.exists(raw) and os.path.getsize(raw) == nbytes:
        return os.path.dirname(st), raw
    os.makedirs(os.path.dirname(st), exist_ok=True)
    head = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4],
                             "data_offsets": [0, nbytes]}}).encode()
    head += b" " * (-len(head) % 8)
    with open(st + ".tmp", "wb") as f, open(raw + ".tmp", "wb") as g:
        f.write(len(head).to_bytes(8, "little") + head)
        for off in range(0, nbytes, 16 * MiB):
            b = os.urandom(min(16 * MiB, nbytes - off))
            f.write(b)
            g.write(b)
    os.rename(st + ".tmp", st)
    os.rename(raw + ".tmp", raw)
    return os.path.dirname(st), raw


def fig_digest(ctx):
    """flexfs-inspect --digest against openssl dgst -sha256 over the same
    bytes, alternated within each run, both warm."""
    inspect, openssl = find_inspect(ctx), shutil.which("openssl")
    if not inspect or not openssl:
        log("digest: skipped: %s not found" % ("flexfs-inspect" if not inspect else "openssl"))
        return []
    nbytes = (4 if ctx.args.quick else 256) * MiB
    ck, raw = ensure_digest_input(ctx, nbytes)
    r = Row("digest", "flexfs-inspect --digest, one tensor of %d MiB" % (nbytes // MiB),
            "GB/s", "openssl dgst -sha256", 0.8,
            note="whole process each: index, view read and SHA-256 vs openssl reading the "
                 "same bytes from a plain file; page cache warm")
    for i in range(ctx.runs + 1):  # the first pass warms both, untimed
        warm([os.path.join(ck, "model.safetensors"), raw])
        t0 = time.monotonic()
        a = subprocess.run([inspect, ck, "--digest"], capture_output=True, text=True)
        t1 = time.monotonic()
        b = subprocess.run([openssl, "dgst", "-sha256", "-r", raw], capture_output=True,
                           text=True)
        t2 = time.monotonic()
        if a.returncode or b.returncode:
            ctx.problems.append("digest: %s" % (a.stderr or b.stderr).strip())
            return [r]
        ha, hb = a.stdout.split()[0], b.stdout.split()[0]
        if ha != hb:
            ctx.problems.append("digest: flexfs-inspect says %s, openssl %s" % (ha, hb))
            return [r]
        if i == 0:
            continue
        fa, fb = tput(nbytes, t1 - t0), tput(nbytes, t2 - t1)
        r.add(fb, fa, fa / fb)
        log("digest run %d: flexfs-inspect %.2f GB/s, openssl %.2f GB/s" % (
            i, fa / GB, fb / GB))
    return [r]


def fig_memory(ctx, info):
    ck = info["dir"]
    row = Row("memory", "peak RSS of the daemon, full read of every view (tp=4)", "MiB", "",
              64 * MiB, better="lower", ratio_unit="MiB", note="VmHWM (no baseline)")
    diag = []
    for i in range(ctx.runs if not ctx.args.quick else 1):
        warm(backing_files(ck))
        with Mount(ctx, ck, "tp=4", name="mem") as m:
            paths = []
            for dp, _dn, fn in os.walk(m.mnt):
                paths += [os.path.join(dp, n) for n in sorted(fn)]
            n, t = readers.seq_read(paths)
            st = m.stats()
        row.add(None, st["VmHWM"], st["VmHWM"])
        diag.append(dict(files=len(paths), bytes=n, seconds=t, VmHWM=st["VmHWM"],
                         VmRSS=st.get("VmRSS"), threads=st.get("Threads"),
                         at_mount_VmHWM=m.at_mount.get("VmHWM")))
        log("memory run %d: %d files, %.2f GB, VmHWM %.1f MiB (at mount %.1f)" % (
            i, len(paths), n / GB, st["VmHWM"] / MiB, m.at_mount.get("VmHWM", 0) / MiB))
    ctx.diag["memory"] = diag
    return [row]


def _par_worker(args):
    path, off, ln, bs = args
    n, _t = readers.seq_read(None, bs=bs, ranges=[(path, off, ln)])
    return n


def parallel_read(jobs):
    """Each job (path, off, len) in its own process, started together.
    -> (bytes, wall seconds from the common start to the last finish)."""
    rfds, pids = [], []
    go_r, go_w = os.pipe()
    for job in jobs:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(go_w)
            os.read(go_r, 1)
            t0 = time.monotonic()
            n = _par_worker(job + (MiB,))
            t1 = time.monotonic()
            os.write(w, json.dumps([n, t0, t1]).encode())
            os._exit(0)
        os.close(w)
        rfds.append(r)
        pids.append(pid)
    os.close(go_r)
    time.sleep(0.2)
    os.write(go_w, b"x" * len(jobs))
    os.close(go_w)
    res = []
    for r in rfds:
        buf = b""
        while True:
            b = os.read(r, 4096)
            if not b:
                break
            buf += b
        os.close(r)
        res.append(json.loads(buf))
    for pid in pids:
        os.waitpid(pid, 0)
    return sum(x[0] for x in res), max(x[2] for x in res) - min(x[1] for x in res)


def fig_parallel(ctx, info):
    ck = info["dir"]
    tp = 8
    row = Row("parallel", "8 readers vs 1 (TP8 views, first read)", "GB/s", "1 reader", None,
              note="ratio = aggregate throughput of 8 concurrent readers / 1 reader")
    raw = Row("parallel", "8 readers vs 1 on the backing files (reference)", "GB/s", "1 reader",
              None, note="same, 8 equal ranges of the .distcp files, page cache warm")
    diag = []
    files = distcp_files(ck)
    for i in range(ctx.runs):
        warm(backing_files(ck))
        with Mount(ctx, ck, "tp=%d" % tp, name="par") as m:
            vf = view_files(m, tp)
            n1, t1 = readers.seq_read(vf)
            if i == 0 and ctx.check != "none":
                record_check(ctx, "ranks/*/model.safetensors tp=8", check_views(ctx, info, vf, tp))
        with Mount(ctx, ck, "tp=%d" % tp, name="par") as m:
            s0 = m.stats()
            n8, t8 = parallel_read([(p, 0, None) for p in view_files(m, tp)])
            s1 = m.stats()
        row.add(tput(n1, t1), tput(n8, t8), tput(n8, t8) / tput(n1, t1))
        sizes = [os.path.getsize(p) for p in files]
        rng = []
        for p, sz in zip(files, sizes):
            q = -(-sz // 4)
            rng += [(p, k * q, min(q, sz - k * q)) for k in range(4)]
        nb1, tb1 = readers.seq_read(None, ranges=rng)
        nb8, tb8 = parallel_read(rng)
        raw.add(tput(nb1, tb1), tput(nb8, tb8), tput(nb8, tb8) / tput(nb1, tb1))
        diag.append(dict(one=dict(bytes=n1, seconds=t1), eight=dict(bytes=n8, seconds=t8),
                         daemon_eight=delta(s0, s1)))
        log("parallel run %d: flexfs 1 reader %.2f, 8 readers %.2f GB/s; backing %.2f / %.2f"
            % (i, n1 / t1 / GB, n8 / t8 / GB, nb1 / tb1 / GB, nb8 / tb8 / GB))
    ctx.diag["parallel"] = dict(runs=diag, passes=[
        diag_pass(ctx, info, "tp=%d" % tp,
                  lambda m: parallel_read([(p, 0, None) for p in view_files(m, tp)])),
        diag_pass(ctx, info, "tp=%d" % tp, lambda m: readers.seq_read(view_files(m, tp)))])
    return [row, raw]


def ensure_zstd(ctx, info, weights=False):
    """info's checkpoint re-written as torch 2.7's ZStandard extension
    would (zstd_ckpt.py), cached beside it; with weights, its values
    replaced by weights-like ones first (not info's truth then)."""
    d = info["dir"].rstrip("/") + ("-zstdw" if weights else "-zstd")
    stamp = os.path.join(d, "bench-ckpt.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            z = json.load(f)
        if z.get("config") == info["config"] and z.get("seed") == info.get("seed") \
                and z.get("zstd", {}).get("weights", False) == weights:
            log("reusing %s" % d)
            return dict(info, dir=d, zstd=z["zstd"])
    r = subprocess.run([PY, os.path.join(HERE, "zstd_ckpt.py"), info["dir"], d] +
                       (["--weights"] if weights else []), capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("zstd_ckpt.py failed:\n%s%s" % (r.stdout, r.stderr))
    log(r.stdout.strip())
    with open(stamp) as f:
        return dict(info, dir=d, zstd=json.load(f)["zstd"])


def zstd_stats(m):
    """The daemon's zstd counters, printed at exit (FLEXFS_ZSTD_STATS=1)."""
    return daemon_stats(m.warnings, "zstd").get(None, {})


def zstd_d(files):
    """zstd -d of every frame of files (items back to back) to /dev/null,
    single-threaded.  -> seconds."""
    t0 = time.monotonic()
    subprocess.run(["zstd", "-d", "-q", "-c", "-T1"] + files, check=True,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def fig_zstd(ctx, info):
    """First read of hf/ and ranks/* of a zstd checkpoint vs zstd -d of
    the same frames to /dev/null (issue #21), for the bench's data (byte
    checked) and for weights-like values (zstd_ckpt.py --weights)."""
    rows = []
    ok = re.compile(r"flexfs: zstd stats")
    hfopt = ",hf_shard_size=%s" % ctx.hf_shard if ctx.hf_shard else ""
    saved = ctx.daemon_env
    ctx.daemon_env = dict(saved or {}, FLEXFS_ZSTD_STATS="1")
    diag = {}
    try:
        for weights in (False, True):
            z = ensure_zstd(ctx, info, weights)
            ck, content = z["dir"], z["zstd"]["content_bytes"]
            what = "weights-like" if weights else "bench data"
            note = "%s, items compress %.2fx" % (what, content / z["zstd"]["frame_bytes"])
            tag = "zstd %s: " % what
            hf = Row("zstd", tag + "hf/ (TP1) first read vs zstd -d", "GB/s", "zstd -d", 0.8,
                     note="ratio = flexfs served / zstd -d content rate; " + note)
            plain = Row("zstd", tag + "hf/ (TP1) vs the plain checkpoint's hf/", "GB/s",
                        "plain", None, note="the same view of the uncompressed "
                        "checkpoint through flexfs (bench data)")
            lim = Row("zstd", tag + "hf/ (TP1) vs min(zstd -d, plain hf/)", "GB/s",
                      "min(zstd -d, plain)", 0.8,
                      note="the goal judged against what FUSE allows: the plain "
                      "checkpoint's hf/ in the same run bounds any hf/ through flexfs, "
                      "and is below zstd -d where zstd stores raw blocks")
            r1 = Row("zstd", tag + "ranks/* (TP2), 1 reader vs zstd -d", "GB/s", "zstd -d",
                     0.8, note=note)
            r2 = Row("zstd", tag + "ranks/* (TP2), 2 readers vs 1", "GB/s", "1 reader", None,
                     note="aggregate of one reader per rank, started together")
            amp = Row("zstd", tag + "bytes decompressed per byte served", "x", "", 1.1,
                      better="lower", ratio_unit="x", note="daemon counters, all reads")
            rss = Row("zstd", tag + "daemon peak RSS (cache_size 64M)", "MiB", "", 128 * MiB,
                      better="lower", ratio_unit="MiB", note="VmHWM; goal cache_size + 64 MiB")
            files = distcp_files(ck)
            runs = []
            for i in range(ctx.runs):
                warm(backing_files(ck) + backing_files(info["dir"]))
                tz = zstd_d(files)
                base = tput(content, tz)
                with Mount(ctx, info["dir"], "tp=1" + hfopt, name="zp") as m:
                    np_, tp_ = readers.seq_read(hf_files(m))
                m = Mount(ctx, ck, "tp=1" + hfopt, name="zs", stderr_ok=ok)
                with m:
                    n, t = readers.seq_read(hf_files(m))
                    if i == 0 and ctx.check != "none" and not weights:
                        record_check(ctx, "zstd hf/ (tp=1)", check_hf(ctx, info, m))
                    hwm = m.stats().get("VmHWM", 0)
                    lat = m.latency
                st_hf = zstd_stats(m)
                m = Mount(ctx, ck, "tp=2", name="zs", stderr_ok=ok)
                with m:
                    vf = view_files(m, 2)
                    n1, t1 = readers.seq_read(vf)
                    if i == 0 and ctx.check != "none" and not weights:
                        record_check(ctx, "zstd ranks/* tp=2", check_views(ctx, info, vf, 2))
                    hwm = max(hwm, m.stats().get("VmHWM", 0))
                st_r = zstd_stats(m)
                m = Mount(ctx, ck, "tp=2", name="zs", stderr_ok=ok)
                with m:
                    n2, t2 = parallel_read([(p, 0, None) for p in view_files(m, 2)])
                    hwm = max(hwm, m.stats().get("VmHWM", 0))
                st_p = zstd_stats(m)
                dec = sum(x.get("decoded", 0) for x in (st_hf, st_r, st_p))
                srv = sum(x.get("served", 0) for x in (st_hf, st_r, st_p))
                hf.add(base, tput(n, t), tput(n, t) / base)
                plain.add(tput(np_, tp_), tput(n, t), tput(n, t) / tput(np_, tp_))
                bound = min(base, tput(np_, tp_))
                lim.add(bound, tput(n, t), tput(n, t) / bound)
                r1.add(base, tput(n1, t1), tput(n1, t1) / base)
                r2.add(tput(n1, t1), tput(n2, t2), tput(n2, t2) / tput(n1, t1))
                if srv:
                    amp.add(None, dec / srv, dec / srv)
                rss.add(None, hwm, hwm)
                runs.append(dict(zstd_d_seconds=tz, content=content, mount_latency=lat,
                                 plain_hf=dict(bytes=np_, seconds=tp_),
                                 hf=dict(bytes=n, seconds=t, stats=st_hf),
                                 ranks1=dict(bytes=n1, seconds=t1, stats=st_r),
                                 ranks2=dict(bytes=n2, seconds=t2, stats=st_p), VmHWM=hwm))
                log("zstd %s run %d: zstd -d %.2f GB/s; flexfs hf/ %.2f (plain %.2f), ranks "
                    "1 reader %.2f, 2 readers %.2f GB/s; decoded/served %.3f; VmHWM %.1f "
                    "MiB; mount %.0f ms" % (what, i, base / GB, n / t / GB, np_ / tp_ / GB,
                                            n1 / t1 / GB, n2 / t2 / GB,
                                            dec / srv if srv else float("nan"), hwm / MiB,
                                            lat * 1e3))
            diag[what] = runs
            rows += [hf, plain, lim, r1, r2, amp, rss]
    finally:
        ctx.daemon_env = saved
    ctx.diag["zstd"] = diag
    return rows


def check_many(ctx, info):
    """Quick mode: the 64-rank checkpoint viewed as TP1 is right."""
    with Mount(ctx, info["dir"], "tp=1", name="many") as m:
        truth = ctx.truth(info)
        with open(m.path("index.json")) as f:
            idx = json.load(f)
        res = readers.check_st_files(truth, [m.path("ranks", "tp00_pp00", "model.safetensors")],
                                     truth.full, ctx.check)
        n_idx = len(idx.get("tensors", {}))
        if res["names"] != len(truth.spec) or n_idx != len(truth.spec):
            res["ok"] = False
            res["errors"].append("%d tensors in the view, %d in index.json, want %d"
                                 % (res["names"], n_idx, len(truth.spec)))
    record_check(ctx, "64-rank checkpoint as TP1", res)


# ---------------------------------------------------------------------------


def machine_info(ctx):
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
        except Exception:
            return ""
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    mem = sh("grep MemTotal /proc/meminfo | awk '{print $2}'")
    dev = sh("df --output=source %s | tail -1" % ctx.workdir)
    return dict(cpu=cpu, cores=os.cpu_count(), mem_kib=int(mem or 0), kernel=platform.release(),
                os=sh(". /etc/os-release; echo $PRETTY_NAME"),
                workdir_device=dev, fstype=sh("df --output=fstype %s | tail -1" % ctx.workdir),
                lsblk=sh("lsblk -d -o NAME,ROTA,MODEL,SIZE,TYPE"),
                libfuse=sh("pkg-config --modversion fuse3"), fusermount=sh("fusermount3 -V"),
                flexfs=ctx.flexfs,
                git=sh("git -C %s rev-parse --short HEAD" % REPO) +
                (" (dirty)" if sh("git -C %s status --porcelain -uno" % REPO) else ""),
                python=sys.version.split()[0])


class Ctx:
    pass


MAT_LINE = re.compile(r"(\d+) files written .*, (\d+) skipped as complete .*, "
                      r"([\d.]+) s, ")


def run_materialize(ctx, cmd, out):
    """Run a flexfs-materialize command into an empty out; return (bytes
    written, the tool's own seconds for writing, wall seconds of the
    command: mpirun's start and the stack's build included, CPU seconds of
    the command and its ranks)."""
    import resource
    shutil.rmtree(out, ignore_errors=True)
    os.sync()  # no writeback of an earlier run inside this one
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    m = MAT_LINE.search(r.stdout)
    if r.returncode or not m:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout,
                                                       r.stderr))
    nbytes = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out) for n in ns
                 if n != ".flexfs-materialize")
    return nbytes, float(m.group(3)), wall, cpu


def compare_tree(ctx, info, opts, out, views):
    """Every file of out against the same file of a mount (byte for
    byte, filecmp), and the same file list."""
    import filecmp
    errors, nbytes, nfiles = [], 0, 0
    with Mount(ctx, info["dir"], opts, name="mat") as m:
        for v in views:
            for d, _, ns in os.walk(m.path(v)):
                for n in ns:
                    a = os.path.join(d, n)
                    b = os.path.join(out, os.path.relpath(a, m.mnt))
                    nfiles += 1
                    if not os.path.exists(b) or not filecmp.cmp(a, b, shallow=False):
                        errors.append(os.path.relpath(a, m.mnt))
                    else:
                        nbytes += os.path.getsize(a)
    have = sum(len([n for n in ns if n != ".flexfs-materialize"]) for _, _, ns in os.walk(out))
    if have != nfiles:
        errors.append("%d files written, the mount has %d" % (have, nfiles))
    return dict(ok=not errors, errors=errors[:10], files=nfiles, bytes_checked=nbytes)


def fig_materialize(ctx, info):
    """flexfs-materialize of ranks/ at tp=4 (safetensors, model.pt and
    .npy of every rank: three copies of the checkpoint's bytes): one process
    (no mpirun) against mpirun -np 1, 2 and 4 on this machine, the output
    fsync'd to the work dir's disk, and again into a tmpfs (/dev/shm: no
    disk, what the ranks' CPUs do); page cache of the source warm.  The
    configurations of one run are measured back to back, so that a change
    of the machine's load hits them alike, each run starting with another
    of them: the first write of a run pays the page cache's reclaim of the
    run before (an untimed write precedes the first run)."""
    mat = os.path.join(os.path.dirname(os.path.dirname(ctx.flexfs)), "tools",
                       "flexfs-materialize")
    if not os.access(mat, os.X_OK):
        ctx.problems.append("mpi: no flexfs-materialize beside %s" % ctx.flexfs)
        return []
    ver = subprocess.run([mat, "--version"], capture_output=True, text=True).stdout
    nps = (1, 2, 4) if "MPI: yes" in ver and shutil.which("mpirun") else ()
    if not nps:
        log("mpi: flexfs-materialize built without MPI or no mpirun: one process only")
    opts, views = "tp=4", ["ranks"]
    outs = [("disk", os.path.join(ctx.workdir, "materialized"))]
    if os.path.isdir("/dev/shm"):
        outs.append(("tmpfs", "/dev/shm/flexfs-bench-materialized"))
    mpirun = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np"]
    rows = {(w, n): Row("mpi", "materialize ranks/ tp=4 to %s, mpirun -np %d vs 1 process"
                        % (w, n), "GB/s", "1 process", None,
                        note="written bytes / the tool's writing time (fsync'd); ratio = "
                             "np ranks / one process; per-rank rate and CPU s/GB in "
                             "diagnostics")
            for w, _ in outs for n in nps}
    diag = []
    warm(backing_files(info["dir"]))
    for where, out in outs:
        run_materialize(ctx, [mat, info["dir"], out, "-o", opts, "--views", views[0]], out)
        shutil.rmtree(out, ignore_errors=True)
    for i in range(ctx.runs):
        warm(backing_files(info["dir"]))
        for where, out in outs:
            base = [mat, info["dir"], out, "-o", opts, "--views", ",".join(views)]
            d = dict(where=where)
            res = {}
            order = [0] + list(nps)
            for n in order[i % len(order):] + order[:i % len(order)]:
                res[n] = run_materialize(ctx, (mpirun + [str(n)] if n else []) + base, out)
                if i == 0 and ctx.check != "none" and n != 1 and where == "disk":
                    record_check(ctx, "materialize ranks/ tp=4, %s"
                                 % ("mpirun -np %d" % n if n else "1 process"),
                                 compare_tree(ctx, info, opts, out, views))
            n1, t1, w1, c1 = res[0]
            d["one"] = dict(bytes=n1, seconds=t1, wall=w1, cpu=c1, cpu_s_per_gb=c1 / (n1 / GB))
            log("mpi run %d %s: 1 process %.2f GB/s (%.2f s, wall %.2f s, %.2f CPU s/GB)"
                % (i, where, n1 / t1 / GB, t1, w1, c1 / (n1 / GB)))
            for n in nps:
                nb, tb, wb, cb = res[n]
                rows[(where, n)].add(tput(n1, t1), tput(nb, tb), tput(nb, tb) / tput(n1, t1))
                d["np%d" % n] = dict(bytes=nb, seconds=tb, wall=wb, cpu=cb,
                                     cpu_s_per_gb=cb / (nb / GB),
                                     per_rank_gbps=nb / tb / GB / n)
                log("mpi run %d %s: -np %d %.2f GB/s, %.2f GB/s per rank (%.2f s, wall %.2f s, "
                    "%.2f CPU s/GB)" % (i, where, n, nb / tb / GB, nb / tb / GB / n, tb, wb,
                                        cb / (nb / GB)))
            shutil.rmtree(out, ignore_errors=True)
            diag.append(d)
    ctx.diag["mpi_materialize"] = diag
    return [rows[(w, n)] for w, _ in outs for n in nps]


# ---------------------------------------------------------------------------
# loaders: real loaders against the FUSE limit and the floor, in one run

LOADERS = (("read", "none"), ("mmap", "none"), ("mmap", "seq"), ("mmap", "huge"),
           ("npy", "none"), ("st_load", "none"), ("st_open", "none"), ("pt_mmap", "none"))
LOADER_DESC = {"read": "read() 1 MiB", "mmap": "mmap copy", "npy": "np.load(mmap) + copy",
               "st_load": "safetensors load_file + copy",
               "st_open": "safe_open + get_tensor + copy",
               "pt_mmap": "torch.load(mmap=True) + copy"}
LOADER_TARGETS = ("floor", "pass", "kpass", "flexfs", "flexfs_dio")


def ensure_own_hf(ctx, info):
    """A Hugging Face checkpoint flexfs wrote: hf/ of a tp=1 mount of the
    benchmark checkpoint copied out once, one model.safetensors (shards
    would not do: a mount of a sharded source orders its tensors by the
    index's names, so other shards).  hf/ of a mount of it is byte for
    byte its files: what -o passthrough serves from the files themselves."""
    d = os.path.join(ctx.workdir, os.path.basename(info["dir"]) + "-own-hf")
    stamp = os.path.join(d, ".complete")
    if os.path.exists(stamp):
        return d
    shutil.rmtree(d, ignore_errors=True)
    with Mount(ctx, info["dir"], "tp=1", name="cp") as m:
        shutil.copytree(m.path("hf"), d)
    open(stamp, "w").close()
    return d


_MMAP_DST = []


def mmap_copy(paths, chunk=64 * MiB):
    """Every file mapped (MAP_SHARED, read-only) and copied out chunk by
    chunk into one reused buffer (allocated and touched once, outside the
    timing), as a loader moving tensors does.  -> (bytes, seconds)."""
    import mmap
    import numpy as np
    if not _MMAP_DST:
        _MMAP_DST.append(np.ones(chunk, np.uint8))
    dst = _MMAP_DST[0]
    total = 0
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not size:
                continue
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            src = np.frombuffer(m, np.uint8)
            for off in range(0, size, chunk):
                k = min(chunk, size - off)
                dst[:k] = src[off:off + k]
            total += size
            del src
            m.close()
    return total, time.perf_counter() - t0


# the daemon's counters (FLEXFS_FUSE_STATS=1) and its INIT fallback line
FUSE_STATS = re.compile(r"flexfs: fuse stats: |passthrough not applied")


def fig_passthrough(ctx, info):
    """-o passthrough (#24): hf/ of a checkpoint flexfs wrote (every file
    the whole of one backing file) read through flexfs with and without
    the option, against the same files read directly in page cache (the
    floor), in the same run, read() and an mmap copy, first read on fresh
    mounts; the targets' order alternates between runs.  The daemon's own
    counters must show no READ request for the passthrough mount."""
    d = ensure_own_hf(ctx, info)
    plain = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))
    ready = os.path.join("hf", os.path.basename(plain[0]))  # a passthrough open
    ways = (("read", readers.seq_read, "read() 1 MiB"), ("mmap", mmap_copy, "mmap copy"))
    rows = {}
    for w, _f, label in ways:
        rows[w] = (Row("passthrough_" + w, "passthrough hf/ (own, TP1), %s, first read" % label,
                       "GB/s", "plain warm", 0.9),
                   Row("passthrough_" + w + "_off", "  same without -o passthrough (flexfs)",
                       "GB/s", "plain warm", None),
                   Row("passthrough_" + w + "_cpu", "  reader CPU s/GB: passthrough / plain",
                       None, "plain", None, better="lower"))

    def timed(f, files):
        r0 = os.times()
        n, t = f(files)
        r1 = os.times()
        return n, t, ((r1.user - r0.user) + (r1.system - r0.system)) / (n / GB)
    mmap_copy([])  # its buffer, outside the timing
    old = os.environ.get("FLEXFS_FUSE_STATS")
    os.environ["FLEXFS_FUSE_STATS"] = "1"
    diag = []
    try:
        for i in range(ctx.runs):
            for w, f, _label in ways:
                warm(plain)
                nb, tb, cb = timed(f, plain)
                got = {}
                order = ("pt", "off") if i % 2 == 0 else ("off", "pt")
                for t in order:
                    opts = "tp=1" + (",passthrough" if t == "pt" else "")
                    m = Mount(ctx, d, opts, name="pt-" + t, stderr_ok=FUSE_STATS,
                              ready=ready)
                    with m:
                        files = [m.path("hf", os.path.basename(p)) for p in plain]
                        got[t] = timed(f, files)
                        if i == 0 and w == "read" and ctx.check != "none":
                            bad = [p for p, q in zip(plain, files)
                                   if subprocess.run(["cmp", "-s", p, q]).returncode]
                            record_check(ctx, "hf/ of own checkpoint -o %s" % opts,
                                         dict(ok=not bad, errors=bad, tensors_checked=0,
                                              bytes_checked=sum(map(os.path.getsize, plain))))
                    st = daemon_stats(m.warnings, "fuse").get(None, {})
                    fell = [x for x in m.warnings if "not applied" in x]
                    diag.append(dict(run=i, way=w, target=t, stats=st, fallback=fell))
                    if t == "pt" and fell:
                        # the kernel or this process cannot (Linux < 6.9, no
                        # CAP_SYS_ADMIN, a work dir on a stacked filesystem)
                        log("passthrough: skipped: %s" % fell[0])
                        ctx.diag["passthrough"] = diag
                        return []
                    if t == "pt" and st.get("reads", 1) != 0:
                        ctx.problems.append("passthrough: %s: %s READ requests reached the "
                                            "daemon" % (w, st.get("reads")))
                    if got[t][0] != nb:
                        ctx.problems.append("passthrough: %s %s: %d bytes, not %d" % (
                            w, t, got[t][0], nb))
                base = tput(nb, tb)
                for t, row in zip(("pt", "off"), rows[w]):
                    v = tput(*got[t][:2])
                    row.add(base, v, v / base)
                rows[w][2].add(cb, got["pt"][2], got["pt"][2] / cb if cb else None)
                log("passthrough run %d %s: plain %.2f, passthrough %.2f, flexfs %.2f GB/s; "
                    "reader CPU s/GB %.3f / %.3f / %.3f" % (
                        i, w, base / GB, tput(*got["pt"][:2]) / GB, tput(*got["off"][:2]) / GB,
                        cb, got["pt"][2], got["off"][2]))
    finally:
        if old is None:
            os.environ.pop("FLEXFS_FUSE_STATS", None)
        else:
            os.environ["FLEXFS_FUSE_STATS"] = old
    ctx.diag["passthrough"] = diag
    return [r for w, _f, _l in ways for r in rows[w]]


def find_fusepass(ctx):
    """flexfs-fusepass, built by CMake next to flexfs (tools/bench/)."""
    build = os.path.dirname(os.path.dirname(ctx.flexfs))
    p = os.path.join(build, "tools", "bench", "flexfs-fusepass")
    return p if os.access(p, os.X_OK) else None


def bdi_of(path):
    st = os.stat(path)
    return "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(st.st_dev), os.minor(st.st_dev))


def ensure_view_copies(ctx, info, tp):
    """Plain copies of ranks/*/ (safetensors, .pt, .npy) of a tp view, read
    once through flexfs: the floor's files and the passthrough's backing."""
    d = os.path.join(ctx.loader_root, os.path.basename(info["dir"]) + "-views-tp%d" % tp)
    stamp = os.path.join(d, ".complete")
    if os.path.exists(stamp):
        return d
    shutil.rmtree(d, ignore_errors=True)
    with Mount(ctx, info["dir"], "tp=%d" % tp, name="cp") as m:
        shutil.copytree(m.path("ranks"), os.path.join(d, "ranks"))
    open(stamp, "w").close()
    return d


def tree_files(d):
    return [os.path.join(r, n) for r, _, ns in os.walk(d) for n in ns if not n.startswith(".")]


def torch_dcp_seconds(ctx, info, tag, tp):
    """torch's own DCP load of info's checkpoint into a TP-tp layout
    (torch_load.py; torch 1.13, or 2.6 in the chroot), backing files in page
    cache, memory primed.  -> seconds, imports excluded."""
    ck = info["dir"]
    warm(backing_files(ck))
    prime_memory(ctx, 3 * info["config"]["bytes"] + 2**30)
    if tag == "t26":
        cmd = ctx.chroot.cmd("torch_load.py", "--ckpt", ctx.chroot.path(ck), "--tp", str(tp))
    else:
        cmd = [PY, os.path.join(ctx.scripts, "torch_load.py"), "--ckpt", ck, "--tp", str(tp)]
    return run_json(cmd)["seconds"]


def loader_cmd(ctx, mode, adv, d, tp):
    if mode in ("st_load", "st_open", "pt_mmap"):
        return ctx.chroot.cmd("loaders.py", "--mode", mode, "--advice", adv,
                              "--dir", ctx.chroot.inner + d[len(ctx.chroot.outer):],
                              "--tp", str(tp))
    return [PY, os.path.join(HERE, "loaders.py"), "--mode", mode, "--advice", adv,
            "--dir", d, "--tp", str(tp)]


def loaders_bytes_read(ctx, info, tp, loaders, nb):
    """Bytes read per byte served, per loader path: one cold pass each
    (the backing files fadvised out of the page cache, evict(); fresh
    flexfs mount), the daemon's read_bytes since its exec (storage reads
    it caused, the mount's and readahead included) over the bytes the
    loader got.  A warm pass cannot count them: the daemon splices
    page-cached backing pages, which no per-process counter sees.
    -> {(mode, adv): dict(read_bytes, served, ratio, seconds)}."""
    out = {}
    for mode, adv in loaders:
        # only the backing files: after drop_caches the daemon's exec would
        # also read its binary and the libraries it loads (flexfs-cuda's
        # dlopen included: 11 MB, 1.4 % of this view) and count them
        evict(ctx, backing_files(info["dir"]), method="fadvise")
        with Mount(ctx, info["dir"], "tp=%d" % tp, name="ldb",
                   mnt=os.path.join(ctx.loader_root, "mnt-ldb")) as m:
            r = run_json(loader_cmd(ctx, mode, adv, m.mnt, tp))
            s1 = m.stats()
        if r["bytes"] != nb.get((mode, adv), r["bytes"]):
            ctx.problems.append("loaders %s/%s cold: %d bytes, floor %d" % (
                mode, adv, r["bytes"], nb[(mode, adv)]))
        rb = s1.get("read_bytes", 0)  # since exec: the mount's reads count
        out[(mode, adv)] = dict(read_bytes=rb, served=r["bytes"], ratio=rb / r["bytes"],
                                seconds=r["seconds"])
        log("loaders cold %s/%s: daemon read_bytes %d for %d served (%.4f)" % (
            mode, adv, rb, r["bytes"], rb / r["bytes"]))
    return out


URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


class UringMount(Mount):
    """flexfs-fusepass with FLEXFS_FUSEPASS_URING=1: the fuse module's
    enable_uring is switched on for its INIT only (the connection keeps
    io_uring once INIT has agreed to it) and set back right after."""

    def start(self):
        with open(URING_PARAM) as f:
            old = f.read().strip()
        with open(URING_PARAM, "w") as f:
            f.write("Y\n")
        try:
            return super().start()
        finally:
            with open(URING_PARAM, "w") as f:
                f.write(old + "\n")

    def served(self):
        """-> (reads through io_uring, reads through /dev/fuse) from the
        line the prototype prints at exit, or None."""
        for w in self.warnings:
            m = re.search(r"reads served: (\d+) io_uring, (\d+) /dev/fuse", w)
            if m:
                return int(m.group(1)), int(m.group(2))
        return None


def fig_loaders(ctx, info, info26=None):
    """Every loader of LOADERS on (floor) the plain copies of the TP2 view
    files in page cache, (pass) flexfs-fusepass serving those copies,
    (flexfs) flexfs -o tp=2, (flexfs_dio) flexfs -o tp=2,direct_io; each in
    a fresh process, first read on fresh mounts then re-read, the targets'
    order rotated every run.  In the same run: torch's own DCP load into
    the TP2 layout (1.13; 2.6 of info26, the checkpoint torch 2.6 wrote)
    against each loader's flexfs mount + first read, and one cold pass per
    loader for the bytes read per byte served.  With --fuse-uring, (upass)
    flexfs-fusepass on the FUSE-over-io_uring transport too (prototype)."""
    fp = find_fusepass(ctx)
    if not fp:
        log("loaders: skipped: no flexfs-fusepass next to %s" % ctx.flexfs)
        return []
    tp = 2
    views = ensure_view_copies(ctx, info, tp)
    vfiles = tree_files(views)
    nbytes = info["config"]["bytes"]
    torch_ok = ctx.chroot is not None
    rows, diag, nb = {}, [], {}
    targets = LOADER_TARGETS
    if ctx.fuse_uring:
        if not os.path.exists(URING_PARAM):
            log("loaders: --fuse-uring: no %s (kernel without CONFIG_FUSE_IO_URING)"
                % URING_PARAM)
        else:
            targets = targets + ("upass",)

    def row(key, name, goal, base):
        rows[key] = Row("loaders", name, "s", base, goal,
                        note="ratio = %s time / other time, fresh process each" % base)
        return rows[key]

    loaders = [lv for lv in LOADERS if torch_ok or lv[0] not in ("st_load", "st_open", "pt_mmap")]
    torch_vs = {"1.13": (info, "t113")}
    if torch_ok and info26:
        torch_vs["2.6"] = (info26, "t26")
    for mode, adv in loaders:
        lab = LOADER_DESC[mode] + ("" if adv == "none" else " +MADV_%s" % (
            "SEQUENTIAL" if adv == "seq" else "HUGEPAGE"))
        for ph in ("first", "re-read"):
            row((mode, adv, ph, "pass"), "%s, %s: FUSE limit / floor" % (lab, ph), None, "floor")
            row((mode, adv, ph, "flexfs"), "%s, %s: flexfs / floor" % (lab, ph), 0.9, "floor")
            row((mode, adv, ph, "vs_pass"), "%s, %s: flexfs / FUSE limit" % (lab, ph), 1.0,
                "FUSE limit")
            row((mode, adv, ph, "flexfs_dio"), "%s, %s: flexfs direct_io / floor" % (lab, ph),
                None, "floor")
            row((mode, adv, ph, "kpass"), "%s, %s: FUSE_PASSTHROUGH prototype / floor"
                % (lab, ph), None, "floor")
            if "upass" in targets:
                row((mode, adv, ph, "upass"), "%s, %s: io_uring transport prototype / floor"
                    % (lab, ph), None, "floor")
                row((mode, adv, ph, "u_vs_pass"), "%s, %s: io_uring transport / FUSE limit "
                    "(/dev/fuse)" % (lab, ph), None, "FUSE limit")
        for tv in torch_vs:
            if adv == "none":
                rows[(mode, adv, "torch", tv)] = Row(
                    "loaders", "%s: flexfs mount + first read vs torch %s DCP load TP2"
                    % (lab, tv), "s", "torch %s" % tv, 3.0,
                    note="ratio = torch DCP load time / (flexfs mount + loader first read), "
                         "same run")
                rows[(mode, adv, "torch_floor", tv)] = Row(
                    "loaders", "%s: plain files (floor) first read vs torch %s DCP load TP2"
                    % (lab, tv), "s", "torch %s" % tv, None,
                    note="ratio = torch DCP load time / the loader's time on the floor: what "
                         "any filesystem could reach against torch with this loader")
        rows[(mode, adv, "bytes")] = Row(
            "loaders", "%s: flexfs backing bytes read / byte served, cold" % lab, "x", "",
            1.02, better="lower", ratio_unit="x",
            note="daemon read_bytes / bytes the loader got, one cold pass (page cache "
                 "dropped, fresh mount)")
    for i in range(ctx.runs):
        k = i % len(targets)
        order = targets[k:] + targets[:k]
        tt = {tv: torch_dcp_seconds(ctx, inf, tag, tp) for tv, (inf, tag) in torch_vs.items()}
        log("loaders run %d: torch DCP load TP2 %s" % (
            i, ", ".join("%s %.3f s" % kv for kv in tt.items())))
        for mode, adv in loaders:
            warm(backing_files(info["dir"]) + vfiles)
            mf = Mount(ctx, info["dir"], "tp=%d" % tp, mnt=os.path.join(ctx.loader_root, "mnt-ld"))
            md = Mount(ctx, info["dir"], "tp=%d,direct_io" % tp, name="ldd",
                       mnt=os.path.join(ctx.loader_root, "mnt-ldd"),
                       stderr_ok=re.compile("direct_io"))
            mp = Mount(ctx, views, "", name="ldp", mnt=os.path.join(ctx.loader_root, "mnt-ldp"),
                       ready="ranks/tp00_pp00/model.safetensors",
                       stderr_ok=re.compile("flexfs-fusepass: max_write"))
            mp.argv = [fp, views, mp.mnt, "-f"]
            mk = Mount(ctx, views, "", name="ldk", mnt=os.path.join(ctx.loader_root, "mnt-ldk"),
                       ready="ranks/tp00_pp00/model.safetensors",
                       stderr_ok=re.compile("flexfs-fusepass: max_write"))
            mk.argv = ["env", "FLEXFS_FUSEPASS_PASSTHROUGH=1", fp, views, mk.mnt, "-f"]
            mounts = [mf, md, mp, mk]
            mu = None
            if "upass" in targets:
                mu = UringMount(ctx, views, "", name="ldu",
                                mnt=os.path.join(ctx.loader_root, "mnt-ldu"),
                                ready="ranks/tp00_pp00/model.safetensors",
                                stderr_ok=re.compile("flexfs-fusepass: "))
                mu.argv = ["env", "FLEXFS_FUSEPASS_URING=1", fp, views, mu.mnt, "-f"]
                mounts.append(mu)
            with contextlib.ExitStack() as stack:
                for m in mounts:
                    stack.enter_context(m)
                ra = open(bdi_of(mf.mnt)).read().strip()
                for m in mounts[2:]:
                    with open(bdi_of(m.mnt), "w") as f:  # flexfs's readahead
                        f.write(ra + "\n")
                dirs = dict(floor=views, pass_=mp.mnt, kpass=mk.mnt, flexfs=mf.mnt,
                            flexfs_dio=md.mnt, upass=mu.mnt if mu else None)
                t = {}
                for ph in ("first", "re-read"):
                    for tg in order:
                        d = dirs["pass_" if tg == "pass" else tg]
                        prime_memory(ctx, 2 * nbytes)
                        r = run_json(loader_cmd(ctx, mode, adv, d, tp))
                        t[(ph, tg)] = r["seconds"]
                        nb.setdefault((mode, adv), r["bytes"])
                        if r["bytes"] != nb[(mode, adv)]:
                            ctx.problems.append("loaders %s/%s %s %s: %d bytes, floor %d" % (
                                mode, adv, ph, tg, r["bytes"], nb[(mode, adv)]))
            for ph in ("first", "re-read"):
                fl = t[(ph, "floor")]
                for tg in ("pass", "kpass", "flexfs", "flexfs_dio", "upass"):
                    if (ph, tg) in t:
                        rows[(mode, adv, ph, tg)].add(fl, t[(ph, tg)], fl / t[(ph, tg)])
                if (ph, "upass") in t:
                    rows[(mode, adv, ph, "u_vs_pass")].add(
                        t[(ph, "pass")], t[(ph, "upass")], t[(ph, "pass")] / t[(ph, "upass")])
                rows[(mode, adv, ph, "vs_pass")].add(t[(ph, "pass")], t[(ph, "flexfs")],
                                                     t[(ph, "pass")] / t[(ph, "flexfs")])
            fx = mf.latency + t[("first", "flexfs")]
            for tv in tt:
                if (mode, adv, "torch", tv) in rows:
                    rows[(mode, adv, "torch", tv)].add(tt[tv], fx, tt[tv] / fx)
                    ff = t[("first", "floor")]
                    rows[(mode, adv, "torch_floor", tv)].add(tt[tv], ff, tt[tv] / ff)
            diag.append(dict(run=i, mode=mode, advice=adv, ra_kb=ra, mount_s=mf.latency,
                             torch_dcp_s=tt, uring_served=mu.served() if mu else None,
                             seconds={"%s/%s" % k: v for k, v in t.items()}))
            if mu:
                sv = mu.served()
                log("loaders run %d %s/%s: io_uring first %.3f re-read %.3f s; reads served %s"
                    % (i, mode, adv, t[("first", "upass")], t[("re-read", "upass")],
                       "%d io_uring, %d /dev/fuse" % sv if sv else "unknown"))
                if not sv or not sv[0]:
                    ctx.problems.append("loaders %s/%s: the io_uring prototype served no read "
                                        "through io_uring: %s" % (mode, adv, mu.warnings))
            log("loaders run %d %s/%s: first floor %.3f pass %.3f kpass %.3f flexfs %.3f "
                "dio %.3f; re-read floor %.3f pass %.3f kpass %.3f flexfs %.3f dio %.3f s" % (
                    i, mode, adv, *[t[(ph, tg)] for ph in ("first", "re-read")
                                    for tg in ("floor", "pass", "kpass", "flexfs",
                                               "flexfs_dio")]))
    cold = loaders_bytes_read(ctx, info, tp, loaders, nb)
    for (mode, adv), c in cold.items():
        rows[(mode, adv, "bytes")].add(None, c["ratio"], c["ratio"])
    ctx.diag["loaders"] = dict(runs=diag, views=views, loadavg=os.getloadavg(),
                               cold={"%s/%s" % k: v for k, v in cold.items()})
    return list(rows.values())


def find_flexfs(args):
    for p in (args.flexfs, os.environ.get("FLEXFS_BIN"),
              os.path.join(REPO, "build-bench", "fs", "flexfs"),
              os.path.join(REPO, "build", "fs", "flexfs")):
        if p and os.access(p, os.X_OK):
            return os.path.abspath(p)
    sys.exit("flexfs-bench: no flexfs binary (build it, or pass --flexfs / FLEXFS_BIN)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--size", default="2G", help="checkpoint size (default 2G)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="tiny checkpoint, one run, check every byte, assert no timing")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-': stdout)")
    ap.add_argument("--workdir", default=os.environ.get("FLEXFS_BENCH_DIR", "/var/tmp/flexfs-bench"))
    ap.add_argument("--flexfs", help="the flexfs binary (default $FLEXFS_BIN, build-bench/, build/)")
    ap.add_argument("--only",
                    default="contig,contig_dio,strided,strided_dio,transposed,e2e,mount,memory,"
                          "parallel,zstd,passthrough,digest",
                    help="comma-separated figures to run")
    ap.add_argument("--no-torch26", action="store_true", help="skip the torch 2.6 chroot")
    ap.add_argument("--check", choices=("none", "sample", "all"),
                    help="byte checks (default: all with --quick, else sample)")
    ap.add_argument("--evict", choices=("auto", "fadvise"), default="auto",
                    help="cold cache: drop_caches when permitted (auto) or fadvise only")
    ap.add_argument("--clean", action="store_true", help="remove the work dir and exit")
    ap.add_argument("--no-prime", action="store_true",
                    help="e2e: do not touch and free memory before each measured process "
                         "(see prime_memory())")
    ap.add_argument("--fuse-ra-kb", type=int, metavar="KB",
                    help="what-if: set the FUSE mount's bdi read_ahead_kb after each mount "
                         "(kernel default 128)")
    ap.add_argument("--fuse-uring", action="store_true",
                    help="loaders: also the FUSE-over-io_uring prototype of flexfs-fusepass "
                         "(sets the fuse module's enable_uring for its mount, then back)")
    ap.add_argument("--daemon-env", action="append", default=[], metavar="K=V",
                    help="what-if: extra environment for the flexfs daemon (e.g. LD_PRELOAD=)")
    args = ap.parse_args(argv)

    if args.clean:
        cleanup_mounts()
        if os.path.isdir(args.workdir):
            for n in os.listdir(args.workdir):
                if n.startswith("mnt-") and os.path.ismount(os.path.join(args.workdir, n)):
                    sys.exit("flexfs-bench: %s is still mounted" % n)
            shutil.rmtree(args.workdir)
            log("removed %s" % args.workdir)
        return 0

    if not os.path.exists("/dev/fuse"):
        print("flexfs-bench: SKIP: no /dev/fuse")
        return 77
    if not shutil.which("fusermount3"):
        sys.exit("flexfs-bench: fusermount3 not found")

    ctx = Ctx()
    ctx.args = args
    ctx.flexfs = find_flexfs(args)
    ctx.workdir = os.path.abspath(args.workdir)
    os.makedirs(ctx.workdir, exist_ok=True)
    ctx.runs = 1 if args.quick else args.runs
    ctx.check = args.check or ("all" if args.quick else "sample")
    ctx.hf_shard = "512K" if args.quick else None
    ctx.problems, ctx.checks, ctx.diag = [], {}, {}
    ctx.warned = set()  # (mount options, expected daemon warning) already logged
    ctx.fuse_ra_kb = args.fuse_ra_kb
    ctx.fuse_uring = args.fuse_uring
    ctx.prime = not args.no_prime and not args.quick
    ctx.daemon_env = dict(kv.split("=", 1) for kv in args.daemon_env)
    truths = {}

    def truth(info):
        if info["dir"] not in truths:
            truths[info["dir"]] = readers.truth_for(info)
        return truths[info["dir"]]
    ctx.truth = truth
    only = set(args.only.split(","))
    atexit.register(cleanup_mounts)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))

    ctx.scripts = scripts_dir(ctx)
    ctx.drop, drop_why = pick_drop_method(ctx)
    ctx.perf = perf_usable() and not args.quick
    log("flexfs %s; work dir %s; cold cache by %s" % (ctx.flexfs, ctx.workdir, drop_why))
    t26 = (not args.no_torch26 and os.path.exists(CHROOT + "/usr/bin/python3")
           and os.geteuid() == 0)
    ctx.chroot = Chroot(ctx) if t26 else None
    # the loaders' files and mounts: inside the chroot's bind of the work
    # dir when there is one (mount propagation may be private)
    ctx.loader_root = ctx.chroot.outer if ctx.chroot else ctx.workdir
    doc = dict(machine=machine_info(ctx), args=vars(args), evict=drop_why,
               loadavg_start=os.getloadavg(), started=time.strftime("%Y-%m-%d %H:%M:%S"))
    t_start = time.monotonic()
    rows = []
    try:
        if ctx.chroot:
            ctx.chroot.__enter__()
        big = many = None
        if args.quick:
            big = ensure_ckpt(ctx, "t113", "mini", layers=3, full_check=True)
            many = ensure_ckpt(ctx, "t113", "many", layers=12, layout="tp8pp8")
        elif only - {"transposed", "gpu", "digest", "scale"}:
            # (transposed and gpu read the transposed checkpoint only: a
            # device session's tools/gpu-check.sh builds nothing else)
            big = ensure_ckpt(ctx, "t113", "tinyllama", size=model.parse_size(args.size))
            many = ensure_ckpt(ctx, "t113", "many", layers=1111, layout="tp8pp8", limit=10000)
        big26 = None
        if ctx.chroot and ("e2e" in only or "loaders" in only):
            big26 = ensure_ckpt(ctx, "t26", big["config"]["preset"],
                                layers=big["config"]["layers"], full_check=args.quick)
        trans = None
        if "transposed" in only or "gpu" in only:
            trans = ensure_transposed(ctx, 512 if args.quick else 4096, full_check=args.quick)
        doc["checkpoints"] = {k: v for k, v in
                              dict(big_t113=big, big_t26=big26, many=many,
                                   transposed_t113=trans).items() if v}
        if args.quick:
            check_many(ctx, many)
        if "contig" in only:
            rows += fig_contig(ctx, big)
        if "contig_dio" in only:
            rows += fig_contig(ctx, big, dio=True)
        if "strided" in only:
            rows += fig_strided(ctx, big)
        if "strided_dio" in only:
            rows += fig_strided(ctx, big, dio=True)
        if "transposed" in only:
            rows += fig_transposed(ctx, trans)
        if "gpu" in only:
            rows += fig_gpu(ctx, trans)
        if "e2e" in only:
            rows += fig_e2e(ctx, big, "t113")
            if big26:
                rows += fig_e2e(ctx, big26, "t26")
        if "mount" in only:
            rows += fig_mount(ctx, many, big)
        if "memory" in only:
            rows += fig_memory(ctx, big)
        if "parallel" in only:
            rows += fig_parallel(ctx, big)
        if "zstd" in only:
            rows += fig_zstd(ctx, big)
        if "passthrough" in only:
            rows += fig_passthrough(ctx, big)
        if "loaders" in only:
            rows += fig_loaders(ctx, big, big26)
        if "digest" in only:
            rows += fig_digest(ctx)
        if "scale" in only:
            rows += scale.fig_scale(ctx, sys.modules[__name__])
        if "mpi" in only:
            rows += fig_materialize(ctx, big)
            # the distributed mount's remote fetch (mpi_fetch.py)
            rows += mpi_fetch.fig_mpi_fetch(ctx, big, sys.modules[__name__])
            rows += mpi_fetch.fig_mpi_scale(ctx, many, sys.modules[__name__],
                                            (2, 4) if args.quick else (2, 4, 8, 16))
    finally:
        cleanup_mounts()
        if ctx.chroot:
            ctx.chroot.__exit__()
    doc["rows"] = [r.doc() for r in rows]
    doc["checks"] = ctx.checks
    doc["diagnostics"] = ctx.diag
    doc["problems"] = ctx.problems
    doc["loadavg_end"] = os.getloadavg()
    doc["seconds"] = time.monotonic() - t_start
    out = table(rows)
    summary = "checks: %d run, %d failed; %d problem(s); %.0f s; loadavg %.2f -> %.2f" % (
        len(ctx.checks), sum(1 for c in ctx.checks.values() if not c.get("ok")),
        len(ctx.problems), doc["seconds"], doc["loadavg_start"][0], doc["loadavg_end"][0])
    if args.json:
        text = json.dumps(doc, indent=1, default=str)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.json != "-":
        print(out)
        print(summary)
        if args.quick:
            print("(quick mode: timings are not meaningful and are not asserted)")
        for p in ctx.problems:
            print("PROBLEM: " + p)
    return 1 if ctx.problems else 0


if __name__ == "__main__":
    sys.exit(main())
