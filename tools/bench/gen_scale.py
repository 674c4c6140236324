#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the scale figure's DCP checkpoints: many chunks, few bytes.

    gen_scale.py --out DIR --tensors T --ranks R [--cols C] [--items repeat|real]

T tensors of shape [R, C] float32, each row-split over R simulated ranks:
T x R chunks.  The .metadata is torch's own: the Metadata,
TensorStorageMetadata, ChunkStorageMetadata, MetadataIndex and
_StorageInfo objects of whichever torch runs this (1.13's
torch.distributed._shard.checkpoint, 2.x's torch.distributed.checkpoint),
pickled as FileSystemWriter.finish() pickles them (pickle.dump, the
default protocol).

--items repeat (the default): the data file __0_0.distcp holds T real
items, torch.save of a [1, C] float32 tensor each, written as torch's
FileSystemWriter writes a tensor item (torch.save into the file at the
item's offset); every rank's chunk of tensor t names item t.  The bytes a
view serves are then repeated, which is all a mount-time figure needs,
and the data stays T items whatever R is.

--items real: one __r_0.distcp per rank, one item per chunk, row r of
tensor t holding the float32 values t * R * C + r * C + [0, C): the
read-rate figure's checkpoints (many small items against few large ones,
the same bytes) and a checkable view.

--no-index: every storage_data key's index None, as Megatron-Core's
saves leave it (torch's own planner numbers each chunk).

--plans: the Metadata also carries all_local_plans, as Megatron-Core's
coordinator attaches it (megatron/core/dist_checkpointing/strategies/
torch.py, MCoreSavePlanner.create_global_plan, 0.12 on; torch's SavePlan
class here): one SavePlan per rank whose WriteItems' chunks are the very
ChunkStorageMetadata objects of state_dict_metadata (torch's
create_default_global_save_plan appends item.tensor_data.chunk), so the
pickle names them again from the plans.

Writes DIR/.metadata, the data files and, last, DIR/scale.json (the
geometry, torch's version, the seconds spent pickling, and the seconds
pickle.load takes to read the .metadata back in this interpreter: the
figure's baseline, "Python unpickles the same .metadata").
"""

import argparse
import io
import json
import os
import pickle
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "fixtures"))

import gen_dcp  # noqa: E402  (tools/fixtures/gen_dcp.py: torch's DCP names)


# what the .metadata looks like; checkpoints of another generator are
# written again (2: one torch.Size per chunk, as torch's planner makes them;
# 3: each storage_data key carries its chunk's index, as torch's global plan
# writes it)
GENERATOR = 3


def storage_info_class(api):
    try:
        from torch.distributed.checkpoint.filesystem import _StorageInfo
    except ImportError:
        from torch.distributed._shard.checkpoint.filesystem import _StorageInfo
    return _StorageInfo


def item_bytes(torch, t):
    b = io.BytesIO()
    torch.save(t, b)
    return b.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--cols", type=int, default=4)
    ap.add_argument("--items", choices=("repeat", "real"), default="repeat")
    ap.add_argument("--plans", action="store_true")
    # Megatron-Core's saves leave every storage_data key's index None (its
    # real fixtures, tests/fixtures/megatron-*)
    ap.add_argument("--no-index", action="store_true")
    a = ap.parse_args()
    api = gen_dcp.TorchAPI()
    torch, md = api.torch, api.md
    SI = storage_info_class(api)
    T, R, C = a.tensors, a.ranks, a.cols
    os.makedirs(a.out, exist_ok=True)
    props = api.TensorProperties(dtype=torch.float32)
    t0 = time.monotonic()
    sdm, storage = {}, {}
    if a.items == "repeat":
        with open(os.path.join(a.out, "__0_0.distcp"), "wb") as f:
            where = []
            for t in range(T):
                blob = item_bytes(torch, torch.arange(C, dtype=torch.float32).reshape(1, C) + t)
                where.append((f.tell(), len(blob)))
                f.write(blob)
    plans = [[] for _ in range(R)] if a.plans else None
    files = []
    for r in range(R) if a.items == "real" else ():
        files.append(open(os.path.join(a.out, "__%d_0.distcp" % r), "wb"))
    for t in range(T):
        fqn = "layers.%d.w" % t
        chunks = []
        for r in range(R):
            off = torch.Size([r, 0])
            # one torch.Size per chunk, as torch's planner makes them
            # (planner_helpers.py: each WriteItem's chunk has its own
            # offsets and sizes), so the pickle names no chunk's sizes
            # again from another chunk
            chunks.append(md.ChunkStorageMetadata(offsets=off, sizes=torch.Size([1, C])))
            if plans is not None:
                plans[r].append(api.pl.WriteItem(
                    index=md.MetadataIndex(fqn, off), type=api.pl.WriteItemType.SHARD,
                    tensor_data=api.pl.TensorWriteData(chunk=chunks[-1], properties=props,
                                                       size=torch.Size([R, C]))))
            # the key's index is the chunk's place in the tensor's chunks
            # list, as torch's global plan rewrites it
            # (default_planner.py, create_default_global_save_plan(),
            # rewrite_index_hints); its offsets are a torch.Size of their
            # own, as in a multi-process save, where the write results
            # reach the coordinator pickled (torch 2.6's fsdp2 fixture:
            # no key shares its chunk's offsets)
            key = md.MetadataIndex(fqn, torch.Size([r, 0]), None if a.no_index else r)
            if a.items == "repeat":
                o, n = where[t]
                storage[key] = SI("__0_0.distcp", o, n)
            else:
                f = files[r]
                v = torch.arange(C, dtype=torch.float32).reshape(1, C) + (t * R * C + r * C)
                blob = item_bytes(torch, v)
                storage[key] = SI("__%d_0.distcp" % r, f.tell(), len(blob))
                f.write(blob)
        sdm[fqn] = md.TensorStorageMetadata(
            properties=props, size=torch.Size([R, C]), chunks=chunks)
    for f in files:
        f.close()
    meta = md.Metadata(state_dict_metadata=sdm, storage_data=storage)
    if plans is not None:
        meta.all_local_plans = [api.pl.SavePlan(items) for items in plans]
    path = os.path.join(a.out, ".metadata")
    with open(path, "wb") as f:
        pickle.dump(meta, f)
    t_write = time.monotonic() - t0
    del meta, sdm, storage
    t0 = time.monotonic()
    with open(path, "rb") as f:
        back = pickle.load(f)
    t_load = time.monotonic() - t0
    assert len(back.state_dict_metadata) == T
    del back
    stamp = dict(generator=GENERATOR, tensors=T, ranks=R, cols=C, chunks=T * R,
                 items=a.items, plans=a.plans,
                 metadata_bytes=os.path.getsize(path), torch=torch.__version__,
                 write_s=t_write, pickle_load_s=t_load)
    with open(os.path.join(a.out, "scale.json"), "w") as f:
        json.dump(stamp, f, indent=1)
    print(json.dumps(stamp))


if __name__ == "__main__":
    main()
