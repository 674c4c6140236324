#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Write a torch DCP checkpoint of N tensors in torch 1.13's default
layout, one file per item (FileSystemWriter(single_file_per_rank=False)),
with torch's own save_state_dict (no process group): N .distcp files.

Tensor "w.%06d" % i is float32 [4*i, 4*i + 4) (exact in float32 below 2^24),
so a reader checks any of them without a truth file.

usage: gen_many_items.py OUT N
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "../../../tools/fixtures"))
from gen_dcp import TorchAPI  # noqa: E402  (torch import with its 3.11 shim)


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    api = TorchAPI()
    torch = api.torch
    assert 4 * n < 1 << 24
    sd = {"w.%06d" % i: torch.arange(4 * i, 4 * i + 4, dtype=torch.float32)
          for i in range(n)}
    os.makedirs(out, exist_ok=True)
    writer = api.dcp.FileSystemWriter(out, single_file_per_rank=False)
    api.dcp.save_state_dict(sd, writer, no_dist=True)
    got = len([f for f in os.listdir(out) if f.endswith(".distcp")])
    assert got == n, (got, n)


if __name__ == "__main__":
    main()
