# SPDX-License-Identifier: MIT
"""flexfs-bench --only mpi, the distributed mount's half (resolver/remote/mpi_mount.h).

fig_mpi_fetch(): remote-fetch throughput.  The benchmark checkpoint (TP2,
two .distcp files) is split over two ranks of mpirun on this machine: rank
0 holds only .metadata, rank 1 every .distcp file (hard links, no copy).
Every byte rank 0 serves then comes from rank 1 through MPI.  Measured: a
sequential 1 MiB read of rank 0's ranks/*/model.safetensors (tp=2) against
the same read of a plain single mount of the whole checkpoint (local
reads), over OpenMPI's shared-memory transport (vader, what one machine
uses) and over TCP through the loopback interface (what nodes use, less
the wire).  Backing files are in the page cache for both.

fig_mpi_scale(): the 10,000-tensor checkpoint saved by 64 ranks (64
.distcp files) spread over N ranks (file i on rank i % N, .metadata on
rank 0): mount time, what the start exchanges (file lists, the metadata
broadcast) and the requests at mount and per read, from the daemons'
FLEXFS_MPI_STATS=1 counters.

Helpers (Mount, Row, log, ...) come from bench.py, passed as `b`.
"""

import os
import shutil
import subprocess
import time

from daemon_stats import daemon_stats


def mpi_ready(flexfs):
    """Why the distributed mount cannot be measured, or None."""
    if not shutil.which("mpirun"):
        return "mpirun not found"
    with open(flexfs, "rb") as f:
        if b"MPI_Init_thread" not in f.read():
            return "flexfs built without MPI (FLEXFS_WITH_MPI=OFF)"
    return None


def link_split(src, dst, np_, place):
    """Hard links of src's files into dst/src0..np_-1 (fresh), file ->
    the ranks place(name, i) gives; mount points dst/mnt0..np_-1."""
    if os.path.isdir(dst):
        for n in os.listdir(dst):
            if n.startswith("mnt") and os.path.ismount(os.path.join(dst, n)):
                subprocess.run(["fusermount3", "-u", "-z", os.path.join(dst, n)])
        shutil.rmtree(dst)
    for r in range(np_):
        os.makedirs(os.path.join(dst, "src%d" % r))
        os.makedirs(os.path.join(dst, "mnt%d" % r))
    names = sorted(n for n in os.listdir(src)
                   if os.path.isfile(os.path.join(src, n)) and n != "bench-ckpt.json")
    for i, n in enumerate(names):
        for r in place(n, i):
            os.link(os.path.join(src, n), os.path.join(dst, "src%d" % r, n))


class Dmount:
    """mpirun -np N flexfs -f SRC{rank} MNT{rank} -o OPTS,mpi; every rank
    mounted on enter (latency: exec to the last rank's index.json), all
    ended on exit by unmounting rank 0."""

    def __init__(self, ctx, d, np_, opts, btl="self,vader"):
        self.ctx, self.d, self.np, self.opts, self.btl = ctx, d, np_, opts, btl
        self.logf = os.path.join(d, "mpirun.log")

    def __enter__(self):
        env = dict(os.environ, FLEXFS_MPI_STATS="1")
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-x", "FLEXFS_MPI_STATS",
               "--mca", "btl", self.btl]
        if "tcp" in self.btl:
            cmd += ["--mca", "btl_tcp_if_include", "lo"]
        cmd += ["-np", str(self.np), self.ctx.flexfs, "-f", os.path.join(self.d, "src{rank}"),
                os.path.join(self.d, "mnt{rank}"), "-o", self.opts + ",mpi"]
        log_ = open(self.logf, "w")
        t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_, stderr=log_,
                                  env=env)
        log_.close()
        for r in range(self.np):
            idx = os.path.join(self.d, "mnt%d" % r, "index.json")
            while True:
                try:
                    with open(idx, "rb") as f:
                        if f.read(1):
                            break
                except OSError:
                    pass
                if self.p.poll() is not None:
                    raise RuntimeError("mpirun exited %d before mounting: %s"
                                       % (self.p.returncode, open(self.logf).read()[-2000:]))
                if time.monotonic() - t0 > 900:
                    raise RuntimeError("the ranks did not mount within 900 s")
                time.sleep(0.005)
        self.latency = time.monotonic() - t0
        return self

    def mnt(self, r=0):
        return os.path.join(self.d, "mnt%d" % r)

    def __exit__(self, *exc):
        subprocess.run(["fusermount3", "-u", self.mnt(0)], check=False)
        try:
            self.rc = self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.rc = self.p.wait()
        for r in range(self.np):
            if os.path.ismount(self.mnt(r)):
                subprocess.run(["fusermount3", "-u", "-z", self.mnt(r)])
        with open(self.logf) as f:
            self.stats = daemon_stats(f, "mpi")
        if self.rc != 0:
            self.ctx.problems.append("mpirun -np %d -o %s: exit %d: %s" % (
                self.np, self.opts, self.rc, open(self.logf).read()[-300:]))


def fig_mpi_fetch(ctx, info, b):
    why = mpi_ready(ctx.flexfs)
    if why:
        b.log("mpi: skipped: " + why)
        return []
    ck, tp = info["dir"], 2
    d = os.path.join(ctx.workdir, "dm-fetch")
    link_split(ck, d, 2, lambda n, i: [0] if n == ".metadata" else [1])
    rows = {}
    for btl, what in (("self,vader", "shared memory"), ("self,tcp", "TCP loopback")):
        rows[btl] = b.Row("mpi", "remote fetch: rank 0's TP2 views, every byte from rank 1 "
                          "(%s)" % what, "GB/s", "local mount", None,
                          note="ratio = remote / local; sequential 1 MiB reads, first read")
    diag = []
    for i in range(ctx.runs):
        b.warm(b.backing_files(ck))
        with b.Mount(ctx, ck, "tp=%d" % tp, name="dml") as m:
            vf = b.view_files(m, tp)
            nl, tl = b.readers.seq_read(vf)
            ref = b.files_digest(vf)[0] if i == 0 and ctx.check != "none" else None
        for btl, row in rows.items():
            with Dmount(ctx, d, 2, "tp=%d" % tp, btl=btl) as dm:
                rvf = [os.path.join(dm.mnt(0), os.path.relpath(p, m.mnt)) for p in vf]
                nr, tr = b.readers.seq_read(rvf)
                if ref:
                    got = b.files_digest(rvf)[0]
                    b.record_check(ctx, "mpi remote views tp=2 (%s)" % btl,
                                   dict(ok=got == ref, files=len(rvf), bytes_checked=nr,
                                        errors=None if got == ref else
                                        "sha256 of rank 0's views differs from the "
                                        "local mount's"))
            row.add(b.tput(nl, tl), b.tput(nr, tr), b.tput(nr, tr) / b.tput(nl, tl))
            diag.append(dict(btl=btl, local=dict(bytes=nl, seconds=tl),
                             remote=dict(bytes=nr, seconds=tr), stats=dm.stats))
            b.log("mpi fetch run %d (%s): local %.2f GB/s, remote %.2f GB/s"
                  % (i, btl, nl / tl / b.GB, nr / tr / b.GB))
    ctx.diag["mpi_fetch"] = diag
    return list(rows.values())


def fig_mpi_scale(ctx, many, b, nps=(2, 4, 8, 16)):
    why = mpi_ready(ctx.flexfs)
    if why:
        return []
    ck, tp, pp = many["dir"], 8, 8
    row = b.Row("mpi", "mount of the 64-rank checkpoint (%s tensors) spread over N ranks "
                "(N: %s)" % (many.get("tensors_limit") or "all", ",".join(map(str, nps))), "s",
                "1 process", None, better="lower",
                note="flexfs: the last rank's first byte of index.json; see diagnostics")
    out = []
    with b.Mount(ctx, ck, "tp=%d,pp=%d" % (tp, pp), name="dms") as m:
        base = m.latency
    for np_ in nps:
        d = os.path.join(ctx.workdir, "dm-scale")
        link_split(ck, d, np_, lambda n, i: [0] if n == ".metadata" else [i % np_])
        # the counters of a mount alone, to tell the reads' requests apart
        with Dmount(ctx, d, np_, "tp=%d,pp=%d" % (tp, pp)) as dm0:
            pass
        with Dmount(ctx, d, np_, "tp=%d,pp=%d" % (tp, pp)) as dm:
            vf = [os.path.join(dm.mnt(0), "ranks", r, "model.safetensors")
                  for r in sorted(os.listdir(os.path.join(dm.mnt(0), "ranks")))]
            n, t = b.readers.seq_read(vf)
        s0, m0 = dm.stats.get(0, {}), dm0.stats.get(0, {})
        mount_req = (sum(v.get("requests", 0) for v in dm0.stats.values())
                     / max(1, len(dm0.stats)))
        rd = {k: s0.get(k, 0) - m0.get(k, 0) for k in ("batches", "requests", "bytes")}
        out.append(dict(np=np_, mount_s=dm.latency, mount_only_s=dm0.latency, read_bytes=n,
                        read_s=t, rank0=s0, rank0_mount_only=m0, rank0_reads=rd,
                        mount_requests_per_rank=mount_req, stats=dm.stats))
        row.add(base, dm.latency, dm.latency / base)
        b.log("mpi scale np=%d: mount %.1f s (1 process %.2f s); exchange %d B, broadcast "
              "%d B; requests at mount per rank %.0f; rank 0 read %d B in %.2f s: %d batches "
              "(FUSE reads), %d requests, %d B remote" % (
                  np_, dm.latency, base, s0.get("exchange", 0), s0.get("bcast", 0), mount_req,
                  n, t, rd["batches"], rd["requests"], rd["bytes"]))
    ctx.diag["mpi_scale"] = out
    return [row]
