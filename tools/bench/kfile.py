# SPDX-License-Identifier: MIT
"""One-line kernel files (sysfs, tracefs, /proc/sys) written and read by
the bench's measurement scripts (uring_cpu.py, reread.py)."""


def put(path, value):
    with open(path, "w") as f:
        f.write(value + "\n")


def get(path):
    with open(path) as f:
        return f.read().strip()
