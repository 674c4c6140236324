#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the scale figure's non-DCP checkpoints: many chunks, few bytes.

    gen_scale_fmt.py paddle    --out DIR --tensors T --ranks R [--cols C]
    gen_scale_fmt.py megatron  --out DIR --tensors T --ranks R [--cols C] [--plans]
    gen_scale_fmt.py mindspore --out DIR --tensors T --ranks R [--cols C]

Every checkpoint holds T float32 tensors of shape [R, C], each row-split
over R simulated ranks (T x R chunks); the data of all ranks is the same
("repeated item blobs"), so one rank file is written and the others are
hard links to it.  Each writer is the project's stand-in writer for the
format, scaled:

  paddle     a Paddle Flex checkpoint (2026 field set, pickle protocol 4)
             as tools/fixtures/gen_paddle.py writes it: DIR/0.metadata
             (Metadata, LocalTensorMetadata, LocalTensorIndex under
             Paddle's module paths, pickled as paddle.save's _pickle_save
             pickles them, every rank's objects distinct as after
             all_gather_object) and DIR/{r}_0.distcp (paddle.save's
             _legacy_save of the rank's {key: ndarray} dict plus the name
             table); docs/formats/paddle.md.
  megatron   a Megatron-Core torch_dist iteration directory: the DCP
             checkpoint of gen_scale.py (torch's own Metadata classes),
             metadata.json as Megatron-Core writes it (torch_dist backend,
             version 1) and common.pt copied from the stand-in writer's
             fixture tests/fixtures/megatron-untied (tools/fixtures/
             gen_megatron.py); docs/formats/megatron.md#save-directory.
             --plans: the .metadata also holds all_local_plans, as
             Megatron-Core 0.12 on writes it (gen_scale.py --plans).
  mindspore  a MindSpore checkpoint of R ranks (MP = R, DP = 1):
             DIR/strategy/ckpt_strategy_rank_0.ckpt (ParallelStrategyMap,
             protobuf, the C++ writer's MatMul column layout: dev_matrix
             [1, 1, R], tensor_map [0, 1]) and DIR/ckpt/rank_{r}/
             net_rank_{r}-1_1.ckpt (one serialized Checkpoint message per
             tensor slice, MindSpore >= 2.3's writer), both written with
             tools/fixtures/gen_mindspore.py's encoders;
             docs/formats/mindspore.md.

Writes DIR/scale.json last (geometry, the metadata file(s) the baseline
decodes and their size, seconds spent writing).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, FIXTURES)


def link_ranks(first, paths):
    for p in paths:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if os.path.lexists(p):
            os.unlink(p)
        os.link(first, p)


def gen_paddle(a):
    import numpy as np
    import gen_paddle as gp

    cls = gp.install_classes("flex", "flex2026")
    T, R, C = a.tensors, a.ranks, a.cols
    keys = ["layers.%d.w" % t for t in range(T)]
    # one rank's data file: _legacy_save of {key: Tensor} (all ranks alike)
    sd = {k: gp.Tensor(np.arange(C, dtype="<f4").reshape(1, C) + t,
                       "create_parameter_%d.w_0" % t) for t, k in enumerate(keys)}
    first = os.path.join(a.out, "0_0.distcp")
    gp.paddle_save(sd, first, 4)
    link_ranks(first, [os.path.join(a.out, "%d_0.distcp" % r) for r in range(1, R)])
    # the coordinator's merged metadata; each rank's objects are its own
    # (all_gather_object unpickles every rank's metadata separately)
    sdm, storage, fm = {}, {}, {}
    for r in range(R):
        fname = "%d_0.distcp" % r
        for t in range(T):
            key = "layers.%d.w" % t
            dtype = str("paddle.float32").split(".")[1]
            ltm = cls.LocalTensorMetadata((r, 0), (1, C), dtype, (R, C), False, None)
            sdm.setdefault(keys[t], []).append(ltm)
            lti = cls.LocalTensorIndex(tensor_key=key, global_offset=(r, 0), is_flattened=False,
                                       flattened_range=None, local_shape=(1, C))
            storage[lti] = fname
    for k in keys:
        fm[k] = (k,)
    meta = cls.Metadata()
    meta.state_dict_metadata = sdm
    meta.storage_metadata = storage
    meta.flat_mapping = fm
    path = os.path.join(a.out, "0.metadata")
    gp.paddle_save(meta, path, 4)
    return dict(metadata=["0.metadata"], mount_dir=".", opts="")


# checkpoints of another generator are written again (2: the Megatron
# .metadata from gen_scale.py's third generator, every key's index None)
GENERATOR = 2


def gen_megatron(a):
    subprocess.run([sys.executable, os.path.join(HERE, "gen_scale.py"), "--out", a.out,
                    "--tensors", str(a.tensors), "--ranks", str(a.ranks), "--cols", str(a.cols),
                    "--items", "repeat", "--no-index"] + (["--plans"] if a.plans else []),
                   check=True,
                   stdout=subprocess.DEVNULL)
    os.unlink(os.path.join(a.out, "scale.json"))
    with open(os.path.join(a.out, "metadata.json"), "w") as f:
        # megatron/core/dist_checkpointing/core.py (CheckpointingConfig, save_config)
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)
    shutil.copyfile(os.path.join(REPO, "tests", "fixtures", "megatron-untied", "ckpt",
                                 "iter_0000100", "common.pt"),
                    os.path.join(a.out, "common.pt"))
    return dict(metadata=[".metadata"], mount_dir=".", opts="", plans=a.plans)


def gen_mindspore(a):
    import numpy as np
    import gen_mindspore as gm

    T, R, C = a.tensors, a.ranks, a.cols
    layouts = []
    for t in range(T):
        L = gm.Layout([1, 1, R], [[0], [1]], strategy=[[1, 1], [R, 1]], op="MatMul")
        layouts.append(("model.layers.%d.w" % t, L))
    litems = gm.perm(layouts, lambda it: it[0])
    sitems = gm.perm(gm.strategy_items_of(layouts, "cpp"), lambda it: it[0])
    sp = os.path.join(a.out, "strategy", "ckpt_strategy_rank_0.ckpt")
    os.makedirs(os.path.dirname(sp), exist_ok=True)
    with open(sp, "wb") as f:
        f.write(gm.strategy_pb_bytes(1, sitems, litems, "cpp"))
    ents = [(n, [1, C], "Float32", np.arange(C, dtype="<f4").reshape(1, C) + t)
            for t, (n, _) in enumerate(layouts)]
    b, _ = gm.ckpt_stream(ents)
    rel = lambda r: os.path.join(a.out, "ckpt", "rank_%d" % r, "net_rank_%d-1_1.ckpt" % r)
    os.makedirs(os.path.dirname(rel(0)), exist_ok=True)
    with open(rel(0), "wb") as f:
        f.write(b)
    link_ranks(rel(0), [rel(r) for r in range(1, R)])
    return dict(metadata=["strategy/ckpt_strategy_rank_0.ckpt"], mount_dir="ckpt",
                opts="src_strategy=" + sp, rank_file_bytes=len(b) * R)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("format", choices=("paddle", "megatron", "mindspore"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--tensors", type=int, required=True)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--cols", type=int, default=4)
    ap.add_argument("--plans", action="store_true",
                    help="megatron: all_local_plans in the .metadata")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.monotonic()
    info = {"paddle": gen_paddle, "megatron": gen_megatron, "mindspore": gen_mindspore}[a.format](a)
    stamp = dict(format=a.format, generator=GENERATOR, tensors=a.tensors, ranks=a.ranks,
                 cols=a.cols,
                 chunks=a.tensors * a.ranks, write_s=time.monotonic() - t0,
                 metadata_bytes=sum(os.path.getsize(os.path.join(a.out, m))
                                    for m in info["metadata"]), **info)
    with open(os.path.join(a.out, "scale.json"), "w") as f:
        json.dump(stamp, f, indent=1)
    print(json.dumps(stamp))


if __name__ == "__main__":
    main()
