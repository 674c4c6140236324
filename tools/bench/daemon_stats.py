# SPDX-License-Identifier: MIT
"""The counters a flexfs daemon prints on stderr at exit when asked
(FLEXFS_ZSTD_STATS=1, FLEXFS_MPI_STATS=1, FLEXFS_FUSE_STATS=1; fs/fuse_main.c),
one line each: "flexfs: WHAT stats: [rank N] name value name value ...".
Read by bench.py (zstd, fuse) and mpi_fetch.py (mpi)."""

import re

LINE = re.compile(r"flexfs: (\w+) stats: (?:rank (\d+) )?(.*)")


def daemon_stats(lines, what):
    """The counters of every "flexfs: WHAT stats:" line among lines ->
    {rank: {name: int}}, rank None where the line names none (the last line
    of a rank counts)."""
    out = {}
    for line in lines:
        m = LINE.search(line)
        if m and m.group(1) == what:
            v = m.group(3).split()
            rank = int(m.group(2)) if m.group(2) is not None else None
            out[rank] = {v[i]: int(v[i + 1]) for i in range(0, len(v) - 1, 2)}
    return out
