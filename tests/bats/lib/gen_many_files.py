#!/usr/bin/env python3
"""Write a DCP checkpoint of N one-element-row tensors with torch's own
writer, one file per item (torch 1.13's FileSystemWriter default), and the
truth beside it: gen_many_files.py OUT N writes OUT/ckpt and OUT/truth.json
({fqn: [values]}).  Used at test time (faults.bats), never committed."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "tools", "fixtures"))
import gen_dcp  # noqa: E402

out, n = sys.argv[1], int(sys.argv[2])
api = gen_dcp.TorchAPI()
torch = api.torch
sd = {"t%05d" % i: torch.arange(4, dtype=torch.float32) + 4 * i
      for i in range(n)}
ckpt = os.path.join(out, "ckpt")
os.makedirs(ckpt)
writer = api.dcp.FileSystemWriter(ckpt)
if api.v2:
    api.dcp.save(sd, storage_writer=writer, no_dist=True)
else:
    api.dcp.save_state_dict(sd, writer, no_dist=True)
with open(os.path.join(out, "truth.json"), "w") as f:
    json.dump({k: v.tolist() for k, v in sd.items()}, f)
