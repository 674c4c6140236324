#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Concurrency helpers for tests/bats/stress.bats (and valgrind.bats).

  stress.py snapshot MNT REF
      Copy every file of the mounted tree MNT into REF with one sequential
      read per file (the reference the readers compare against; the test
      then verifies REF itself with check_views.py against the truth).

  stress.py read MNT REF --seconds S --reader K [--hold] [--tolerate]
                 [--progress FILE]
      One reader process.  Until S seconds have passed, it picks files of
      REF (each file once per shuffled pass, so every file is read in every
      pass) and reads random [offset, offset+length) ranges of the same file
      under MNT, comparing every byte with REF.  The access kind rotates
      with K and per operation:
        pread   buffered pread()s; now and then posix_fadvise(DONTNEED)
                evicts the file's pages so reads reach the daemon again
        direct  O_DIRECT pread()s: every one is a FUSE read request with
                this exact (unaligned) offset and length
        mmap    mmap() the whole file, compare random slices, munmap
      Lengths are drawn from 1..16, ..4096 and ..1 MiB, offsets anywhere in
      [0, size] (reads crossing EOF must be short by exactly the overhang).
      --hold: open every file once up front and keep the descriptors (for
      unmount-while-open tests); writes "ready" to FILE.ready once all are
      open and read once.  --tolerate: an OSError (the daemon went away)
      ends the reader quietly with status 0; wrong bytes still fail.
      --progress FILE: the operation count is rewritten there every 0.2 s.
      Exit status: 0 ok, 3 a byte differed (the first difference is
      printed), 2 usage or setup error.

  stress.py reap STATUSFILE -- COMMAND...
      Run COMMAND (a daemonizing flexfs) as a child subreaper: the daemon
      that fuse_daemonize() forks is reparented to this process, so its exit
      status can be collected.  Writes "launcher <rc>", then "daemon <pid>"
      once it is known, then "exit <rc>" or "signal <n>" when it ends, to
      STATUSFILE (each line flushed).  Exits 0 after the daemon is reaped,
      or with the launcher's failure.
"""

import ctypes
import errno
import mmap
import os
import random
import signal
import subprocess
import sys
import time

MISMATCH = 3


def walk_files(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            out.append(os.path.relpath(p, root))
    return out


def snapshot(mnt, ref):
    n = 0
    for rel in walk_files(mnt):
        src = os.path.join(mnt, rel)
        dst = os.path.join(ref, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(src, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            chunks = []
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                chunks.append(b)
            data = b"".join(chunks)
        if len(data) != size:
            print("snapshot: %s: read %d bytes, st_size %d" % (rel, len(data), size),
                  file=sys.stderr)
            return 1
        with open(dst, "wb") as f:
            f.write(data)
        n += 1
    if n == 0:
        print("snapshot: no files under %s" % mnt, file=sys.stderr)
        return 1
    print("snapshot: %d files" % n)
    return 0


def rand_len(rng):
    r = rng.random()
    if r < 0.4:
        return rng.randint(1, 16)
    if r < 0.8:
        return rng.randint(1, 4096)
    return rng.randint(1, 1 << 20)


def rand_range(rng, size):
    """An offset in [0, size] (EOF included), a length, and the expected
    count (short past EOF)."""
    r = rng.random()
    if r < 0.1 or size == 0:
        off = size  # at EOF: 0 bytes
    elif r < 0.2:
        off = max(0, size - rng.randint(1, 64))  # straddles EOF
    else:
        off = rng.randrange(0, size)
    n = rand_len(rng)
    return off, n, max(0, min(n, size - off))


class Mismatch(Exception):
    pass


def check(rel, kind, off, n, got, want):
    if got == want:
        return
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
             min(len(got), len(want)))
    raise Mismatch("%s: %s off=%d len=%d: got %d bytes, want %d; first diff at +%d "
                   "(got %r, want %r)" % (rel, kind, off, n, len(got), len(want), i,
                                          got[i:i + 8], want[i:i + 8]))


class Reader:
    def __init__(self, mnt, ref, k, hold, rng):
        self.mnt, self.ref, self.k, self.hold, self.rng = mnt, ref, k, hold, rng
        self.files = walk_files(ref)
        self.want = {}
        for rel in self.files:
            with open(os.path.join(ref, rel), "rb") as f:
                self.want[rel] = f.read()
        self.fds = {}  # (rel, direct) -> fd, only with hold
        self.ops = 0
        self.bytes = 0
        self.kinds = {"pread": 0, "direct": 0, "mmap": 0}

    def fd(self, rel, direct):
        key = (rel, direct)
        if key in self.fds:
            return self.fds[key], False
        flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
        fd = os.open(os.path.join(self.mnt, rel), flags)
        st = os.fstat(fd)
        if st.st_size != len(self.want[rel]):
            os.close(fd)
            raise Mismatch("%s: st_size %d, reference has %d bytes" %
                           (rel, st.st_size, len(self.want[rel])))
        if self.hold:
            self.fds[key] = fd
            return fd, False
        return fd, True

    def open_all(self):
        for rel in self.files:
            for direct in (False, True):
                self.fd(rel, direct)

    def one(self, rel, kind):
        want = self.want[rel]
        size = len(want)
        rng = self.rng
        fd, close = self.fd(rel, kind == "direct")
        try:
            if kind == "mmap":
                if size == 0:
                    return
                if rng.random() < 0.3:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                m = mmap.mmap(fd, 0, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED)
                try:
                    for _ in range(rng.randint(1, 8)):
                        off, n, cnt = rand_range(rng, size)
                        got = m[off:off + n]
                        check(rel, kind, off, n, got, want[off:off + cnt])
                        self.bytes += len(got)
                        self.ops += 1
                finally:
                    m.close()
            else:
                if kind == "pread" and rng.random() < 0.2:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                for _ in range(rng.randint(1, 8)):
                    off, n, cnt = rand_range(rng, size)
                    got = os.pread(fd, n, off)
                    check(rel, kind, off, n, got, want[off:off + cnt])
                    self.bytes += len(got)
                    self.ops += 1
            self.kinds[kind] += 1
        finally:
            if close:
                os.close(fd)

    def pass_(self):
        order = list(self.files)
        self.rng.shuffle(order)
        kinds = ("pread", "direct", "mmap")
        for i, rel in enumerate(order):
            # the reader's main kind most of the time, the others too
            kind = kinds[self.k % 3] if self.rng.random() < 0.6 else self.rng.choice(kinds)
            self.one(rel, kind)
            yield


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_main(args):
    import argparse
    ap = argparse.ArgumentParser(prog="stress.py read")
    ap.add_argument("mnt")
    ap.add_argument("ref")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--reader", type=int, required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--tolerate", action="store_true")
    ap.add_argument("--progress")
    a = ap.parse_args(args)
    seed = a.seed if a.seed is not None else (os.getpid() * 7919 + int(time.time()))
    rng = random.Random(seed)
    tag = "reader %d (seed %d)" % (a.reader, seed)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    try:
        r = Reader(a.mnt, a.ref, a.reader, a.hold, rng)
    except OSError as e:
        print("%s: setup: %s" % (tag, e), file=sys.stderr)
        return 2
    if not r.files:
        print("%s: no reference files" % tag, file=sys.stderr)
        return 2
    end = time.monotonic() + a.seconds
    last = 0.0
    passes = 0
    try:
        if a.hold:
            r.open_all()
            for _ in r.pass_():
                pass
            passes += 1
            if a.progress:
                write_atomic(a.progress + ".ready", "ready\n")
        while not stop[0] and time.monotonic() < end:
            for _ in r.pass_():
                now = time.monotonic()
                if a.progress and now - last > 0.2:
                    write_atomic(a.progress, "%d\n" % r.ops)
                    last = now
                if stop[0] or now >= end:
                    break
            else:
                passes += 1
    except Mismatch as e:
        print("%s: MISMATCH %s" % (tag, e), file=sys.stderr)
        return MISMATCH
    except OSError as e:
        if a.tolerate:
            print("%s: stopped by %s after %d ops" % (tag, errno.errorcode.get(e.errno, e.errno),
                                                     r.ops))
            return 0
        print("%s: %s after %d ops" % (tag, e, r.ops), file=sys.stderr)
        return 2
    if a.progress:
        write_atomic(a.progress, "%d\n" % r.ops)
    print("%s: %d ops, %d bytes, %d full passes over %d files, by kind %s" %
          (tag, r.ops, r.bytes, passes, len(r.files), r.kinds))
    return 0


def reap_main(args):
    if len(args) < 3 or args[1] != "--":
        print("usage: stress.py reap STATUSFILE -- COMMAND...", file=sys.stderr)
        return 2
    status, cmd = args[0], args[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_CHILD_SUBREAPER = 36
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("reap: prctl: %s" % os.strerror(ctypes.get_errno()), file=sys.stderr)
        return 2
    out = open(status, "w", buffering=1)
    launcher = subprocess.Popen(cmd)
    rc = launcher.wait()
    out.write("launcher %d\n" % rc)
    if rc != 0:
        return rc if rc > 0 else 2
    # the daemon (fuse_daemonize()'s child) is now ours
    try:
        with open("/proc/self/task/%d/children" % os.getpid()) as f:
            kids = f.read().split()
    except OSError:
        kids = []
    out.write("daemon %s\n" % (kids[0] if kids else "?"))
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if os.WIFEXITED(st):
            out.write("exit %d\n" % os.WEXITSTATUS(st))
        elif os.WIFSIGNALED(st):
            out.write("signal %d\n" % os.WTERMSIG(st))
    out.close()
    return 0


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "snapshot" and len(args) == 2:
        return snapshot(*args)
    if cmd == "read":
        return read_main(args)
    if cmd == "reap":
        return reap_main(args)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
