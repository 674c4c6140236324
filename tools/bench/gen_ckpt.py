#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the benchmark's large DCP checkpoint with torch's own DCP writer.

The llama-like model of model.py (bf16), saved TP2 x PP1 as 2 simulated
ranks (or --layout tp8pp8: 64 ranks, for the mount-latency checkpoint) through tools/fixtures/gen_dcp.py's save_checkpoint (torch's own
planner + FileSystemWriter, single_file_per_rank=True): the files are
byte-for-byte what 2 real ranks would write.  Runs under torch 1.13
(/usr/bin/python3) and torch 2.x (the trixie chroot).

    gen_ckpt.py --out DIR [--preset tinyllama] [--size 2G | --layers N]
                [--full-check]

    gen_ckpt.py --out DIR --transposed N [--full-check]

--transposed N: instead, the checkpoint of the "transposed" figure
(model.transposed_config: 8 bf16 weights of about N x N, 256 MiB at N=4096,
each saved as base.t(), whole or as 2 TP chunks that are themselves
transposed views, through gen_dcp's per-chunk "transposed" saving) from 2
ranks.

Writes DIR/.metadata, DIR/__0_0.distcp, DIR/__1_0.distcp, DIR/config.json
and, last, DIR/bench-ckpt.json (the cache stamp: geometry, torch version,
timings).  Every item is then decoded without torch and compared with the
regenerated data (gen_dcp.verify_items); --full-check also loads the
checkpoint back through torch's DCP loader (N->1), as gen_dcp does.
"""

import argparse
import json
import os
import sys
import time
import warnings

here = os.path.dirname(os.path.abspath(__file__))
for p in (here, os.path.join(here, "..", "fixtures")):
    if os.path.isfile(os.path.join(p, "gen_dcp.py")) and p not in sys.path:
        sys.path.insert(0, p)

import gen_dcp  # noqa: E402  (tools/fixtures/gen_dcp.py, reused unmodified)
import model  # noqa: E402
import numpy as np  # noqa: E402

LAYOUTS = {"tp2pp1": (2, 1), "tp8pp8": (8, 8)}


def stage_of(fqn, c, pp):
    """Source PP stage: layers in contiguous groups, embeddings first,
    everything else last (rank = stage * tp + tp_rank)."""
    if fqn.startswith("layers."):
        return int(fqn.split(".")[1]) * pp // c["layers"]
    return 0 if fqn.startswith("tok_embeddings.") else pp - 1


def build_specs(api, c, seed, layout, limit=None):
    torch = api.torch
    tp, pp = LAYOUTS[layout]
    specs = []
    for fqn, shape, axis in model.tensors(c, limit):
        a = model.data(fqn, shape, seed)
        full = torch.from_numpy(a.view("<i2")).view(torch.bfloat16)
        st = stage_of(fqn, c, pp)
        ranks = list(range(st * tp, (st + 1) * tp))
        if axis is None:
            specs.append(gen_dcp.TSpec(fqn, full, owners=ranks))
        else:
            specs.append(gen_dcp.TSpec(fqn, full, gen_dcp.split_chunks(shape, axis, ranks)))
    return specs


def build_transposed_specs(api, c, seed):
    """Specs of the transposed checkpoint: the full value is base.T (made
    contiguous); every chunk is flagged transposed, so gen_dcp saves it as
    the transposed view of a dense (cols, rows) storage, stride (1, rows)."""
    torch = api.torch
    specs = []
    for i, (fqn, base, axis) in enumerate(c["tensors"]):
        a = np.ascontiguousarray(model.transposed_data(fqn, base, seed))
        full = torch.from_numpy(a.view("<i2")).view(torch.bfloat16)
        shape = tuple(full.shape)
        if axis is None:
            chunks = [(i % 2, [0] * len(shape), list(shape), True)]
        else:
            chunks = [(r, o, sz, True) for r, o, sz, _ in
                      gen_dcp.split_chunks(shape, axis, [0, 1])]
        specs.append(gen_dcp.TSpec(fqn, full, chunks))
    return specs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="tinyllama", choices=sorted(model.PRESETS))
    ap.add_argument("--size", default="2G")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--layout", default="tp2pp1", choices=sorted(LAYOUTS),
                    help="source layout (simulated ranks = tp x pp)")
    ap.add_argument("--tensors", type=int, help="keep only the first N tensors")
    ap.add_argument("--transposed", type=int, metavar="N",
                    help="write the transposed checkpoint of base dimension N instead")
    ap.add_argument("--seed", type=int, default=model.SEED)
    ap.add_argument("--full-check", action="store_true",
                    help="also load everything back through torch's DCP loader")
    args = ap.parse_args(argv)

    if args.transposed:
        c = model.transposed_config(args.transposed)
        args.layout = "transposed"
    else:
        c = model.config(args.preset, model.parse_size(args.size), args.layers)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    stamp = os.path.join(out, "bench-ckpt.json")
    if os.path.exists(stamp):
        os.remove(stamp)
    for n in os.listdir(out):
        if n == ".metadata" or n.endswith(".distcp"):
            os.remove(os.path.join(out, n))

    t0 = time.time()
    api = gen_dcp.TorchAPI()
    torch = api.torch
    if args.transposed:
        specs = build_transposed_specs(api, c, args.seed)
    else:
        specs = build_specs(api, c, args.seed, args.layout, args.tensors)
    tp, pp = (2, 1) if args.transposed else LAYOUTS[args.layout]
    world = tp * pp
    t1 = time.time()
    cwd = os.getcwd()
    os.chdir(os.path.dirname(out))  # relative path: no host path in StorageMeta
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
            metadata, writer_rank = gen_dcp.save_checkpoint(
                api, os.path.basename(out), specs, [], world, True)
    finally:
        os.chdir(cwd)
    t2 = time.time()
    gen_dcp.write_json(os.path.join(out, "config.json"), {
        "model_type": "flexfs-transposed", "torch_dtype": "bfloat16",
        "note": "flexfs benchmark: random bf16 weights, each saved by torch as w.t() "
                "(DCP items with stride (1, rows))",
    } if args.transposed else {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": c["dim"], "intermediate_size": c["ffn"],
        "num_attention_heads": c["n_heads"], "num_key_value_heads": c["n_kv_heads"],
        "num_hidden_layers": c["layers"], "vocab_size": c["vocab"],
        "torch_dtype": "bfloat16", "note": "flexfs benchmark: random weights, torchtitan names",
    }, indent=2)

    truth = {s.fqn: gen_dcp.raw_bytes(torch, s.full) for s in specs}
    gen_dcp.verify_items(api, out, metadata, specs, [], truth, writer_rank)
    t3 = time.time()
    if args.full_check:
        gen_dcp.load_back(api, out, specs, [], truth)
    t4 = time.time()
    del truth

    files = sorted(n for n in os.listdir(out) if n.endswith(".distcp"))
    info = dict(generator="tools/bench/gen_ckpt.py (torch writer via tools/fixtures/gen_dcp.py)",
                torch=torch.__version__, dcp_package=api.dcp.__name__, seed=args.seed,
                config=c, world=world, layout=args.layout,
                source_layout="TP%d x PP%d" % (tp, pp), tensors_limit=args.tensors,
                data_bytes=sum(s.full.numel() * 2 for s in specs),
                files={n: os.path.getsize(os.path.join(out, n)) for n in files + [".metadata"]},
                n_tensors=len(specs),
                seconds=dict(data=round(t1 - t0, 2), torch_write=round(t2 - t1, 2),
                             verify_items=round(t3 - t2, 2), load_back=round(t4 - t3, 2)),
                full_check=bool(args.full_check))
    with open(stamp + ".tmp", "w") as f:
        json.dump(info, f, indent=1)
    os.rename(stamp + ".tmp", stamp)
    print("gen_ckpt: torch %s: %d tensors, %.2f GiB in %s; data %.1fs, write %.1fs, "
          "verify %.1fs%s" % (torch.__version__, len(specs), info["data_bytes"] / 2 ** 30, out,
                              t1 - t0, t2 - t1, t3 - t2,
                              ", torch load-back %.1fs" % (t4 - t3) if args.full_check else ""))


if __name__ == "__main__":
    main()
