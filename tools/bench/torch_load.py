#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The torch side of the end-to-end figure: torch's own DCP loader fills
the tensors of every rank of a TP-N target layout, one load_state_dict
call per target rank (as each of N real ranks would), no process group.

    torch_load.py --ckpt DIR --tp 4 [--check none|sample|all]

Runs under torch 1.13 (torch.distributed._shard.checkpoint) and 2.x
(torch.distributed.checkpoint, the trixie chroot).  The state dict of rank
r holds, per tensor, a freshly allocated tensor of that rank's TP-N shard
shape.  The planner is torch's DefaultLoadPlanner with two methods
overridden, because in one process without a process group a rank's
shard cannot be a ShardedTensor/DTensor that knows its global offset:
  create_local_plan: the read items of the rank's chunk, made by torch's
    own helper (1.13 _create_sharded_read_items / 2.x
    create_read_items_for_chunk_list) -- the items a real rank's
    ShardedTensor/DTensor produces;
  lookup_tensor: the destination is the local tensor itself.
Everything else (FileSystemReader.read_data: torch.load of each saved
chunk, narrow, copy_) is torch's.  Prints one JSON line.
"""

import argparse
import json
import os
import sys
import time
import types
import warnings

here = os.path.dirname(os.path.abspath(__file__))
for p in (here, os.path.join(here, "..", "fixtures")):
    if os.path.isfile(os.path.join(p, "gen_dcp.py")) and p not in sys.path:
        sys.path.insert(0, p)

import gen_dcp  # noqa: E402
import model  # noqa: E402
import readers  # noqa: E402


def make_planner(api):
    torch = api.torch
    if api.v2:
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        from torch.distributed.checkpoint.planner import LoadPlan
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        def items_for(fqn, md, offs, sizes):
            ch = api.md.ChunkStorageMetadata(offsets=torch.Size(offs), sizes=torch.Size(sizes))
            return create_read_items_for_chunk_list(fqn, md, [ch])
    else:
        from torch.distributed._shard.checkpoint.default_planner import DefaultLoadPlanner
        from torch.distributed._shard.checkpoint.planner import LoadPlan
        from torch.distributed._shard.checkpoint.planner_helpers import _create_sharded_read_items
        from torch.distributed._shard.metadata import ShardMetadata

        def items_for(fqn, md, offs, sizes):
            sh = types.SimpleNamespace(metadata=ShardMetadata(
                shard_offsets=list(offs), shard_sizes=list(sizes)))
            return _create_sharded_read_items(fqn, md, [sh])

    class RankLoadPlanner(DefaultLoadPlanner):
        def __init__(self, boxes):
            super().__init__()
            self.boxes = boxes  # fqn -> (global offsets, sizes) of this rank

        def create_local_plan(self):
            items = []
            for fqn in self.state_dict:
                md = self.metadata.state_dict_metadata[fqn]
                items += items_for(fqn, md, *self.boxes[fqn])
            return LoadPlan(items)

        def lookup_tensor(self, index):
            return self.state_dict[index.fqn]

    return RankLoadPlanner


def proc_io():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--check", choices=("none", "sample", "all"), default="none")
    args = ap.parse_args(argv)
    with open(os.path.join(args.ckpt, "bench-ckpt.json")) as f:
        info = json.load(f)
    api = gen_dcp.TorchAPI()
    torch = api.torch
    Planner = make_planner(api)
    spec = model.tensors(info["config"], info.get("tensors_limit"))

    got, per_rank = [], []
    total = 0
    io0 = proc_io()
    t0 = time.monotonic()
    for r in range(args.tp):
        tr = time.monotonic()
        sd, boxes = {}, {}
        for fqn, shape, axis in spec:
            offs, sizes = model.target_box(shape, axis, args.tp, r)
            sd[fqn] = torch.empty(sizes, dtype=torch.bfloat16)
            boxes[fqn] = (offs, sizes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            api.dcp.load_state_dict(sd, api.dcp.FileSystemReader(args.ckpt),
                                    no_dist=True, planner=Planner(boxes))
        total += sum(t.numel() * t.element_size() for t in sd.values())
        got.append(sd)
        per_rank.append(time.monotonic() - tr)
    t1 = time.monotonic()
    io1 = proc_io()

    res = dict(torch=torch.__version__, t0=t0, t1=t1, seconds=t1 - t0, bytes=total,
               tensors=sum(len(s) for s in got), per_rank=per_rank,
               io={k: io1[k] - io0[k] for k in io0})
    if args.check != "none":
        as_np = [{k: v.view(torch.int16).numpy().view("<u2") for k, v in sd.items()}
                 for sd in got]
        res["check"] = readers.check_rank_tensors(readers.Truth(info), as_np, args.tp,
                                                  args.check)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
