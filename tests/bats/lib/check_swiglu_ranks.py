#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Each TP rank's linear_fc1 (weight and, when saved, bias) of a mount of a
Megatron torch_dist checkpoint (ranks/tpRR_pp00/model.safetensors, stacked
[layers, rows, ...]; a MoE's experts' decoder.layers.mlp.experts.experts.*
stacked [layers, experts, rows, ...]) equals, layer (and expert) by layer
and bit for bit:
  megatron DIR: the decoder.layers.L.mlp.linear_fc1.* (experts:
    decoder.layers.L.mlp.experts.local_experts.E.linear_fc1.*) that
    Megatron's own per-rank legacy files hold (gen_megatron.py legacy, pp 1:
    DIR/mp_rank_RR/model_optim_rng.pt), [gate_r; up_r] for SwiGLU;
  chunk DIR: torch.chunk's piece r of the fixture's truth
    (DIR/<the same per-layer name>.npy), a plain row split.
A non-homogeneous model's own per-layer keys (decoder.layers.L.mlp.linear_fc1.*,
decoder.layers.L.mlp.experts.experts.linear_fc1.* stacked [experts, rows, ...])
likewise.  Prints "ok: N per-rank layer tensors (M of experts)".

usage: check_swiglu_ranks.py MOUNT TP megatron|chunk DIR
"""
import json
import re
import struct
import sys

import numpy as np
import torch


def safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    return head, data


class Truth:
    """Rank r's torch.chunk piece (rows) of each truth tensor, as bytes."""

    def __init__(self, d, r, tp):
        self.d, self.r, self.tp = d, r, tp

    def __getitem__(self, key):
        a = np.load(f"{self.d}/{key}.npy")
        c = -(-a.shape[0] // self.tp)
        return np.ascontiguousarray(a[self.r * c:(self.r + 1) * c]).view(np.uint8)


# stacked name in the mount -> (number of stacked axes, per-layer name)
KEYS = (
    ("decoder.layers.mlp.linear_fc1", 1, "decoder.layers.{0}.mlp.linear_fc1"),
    ("decoder.layers.mlp.experts.experts.linear_fc1", 2,
     "decoder.layers.{0}.mlp.experts.local_experts.{1}.linear_fc1"),
)


# a layer's own key (docs/formats/megatron.md#stacked-layers) -> (number of stacked axes, per-layer name)
PER_LAYER = (
    (re.compile(r"decoder\.layers\.(\d+)\.mlp\.linear_fc1"), 0,
     "decoder.layers.{L}.mlp.linear_fc1"),
    (re.compile(r"decoder\.layers\.(\d+)\.mlp\.experts\.experts\.linear_fc1"), 1,
     "decoder.layers.{L}.mlp.experts.local_experts.{0}.linear_fc1"),
)


def fc1_keys(head):
    """(name in the mount, stacked axes, per-layer name format) of each linear_fc1."""
    out = list(KEYS)
    for k in head:
        base = k.rsplit(".", 1)[0]
        for rx, n, fmt in PER_LAYER:
            m = rx.fullmatch(base)
            if m and base not in [o[0] for o in out]:
                out.append((base, n, fmt.replace("{L}", m.group(1))))
    return out


def main():
    mnt, tp, mode, src = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    checked = experts = 0
    for r in range(tp):
        head, data = safetensors(f"{mnt}/ranks/tp{r:02d}_pp00/model.safetensors")
        if mode == "megatron":
            sd = torch.load(f"{src}/mp_rank_{r:02d}/model_optim_rng.pt",
                            map_location="cpu")["model"]
        else:
            sd = Truth(src, r, tp)
        for stacked, nstack, per_layer in fc1_keys(head):
            for prm in ("weight", "bias"):
                key = stacked + "." + prm
                if key not in head:
                    continue
                h = head[key]
                lo, hi = h["data_offsets"]
                outer = h["shape"][:nstack]
                got = np.frombuffer(data[lo:hi], dtype=np.uint8).reshape(
                    int(np.prod(outer)), -1)
                for i, idx in enumerate(np.ndindex(*outer)):
                    want = sd[per_layer.format(*idx) + "." + prm]
                    if isinstance(want, torch.Tensor):
                        want = want.contiguous().view(torch.uint8).numpy()
                    want = want.reshape(-1)
                    if list(want.shape) != [got.shape[1]] or not np.array_equal(got[i], want):
                        print(f"rank {r} {key}{list(idx)}: differs from the oracle ({mode})")
                        return 1
                    checked += 1
                    experts += "local_experts" in per_layer
    if not checked:
        print("no linear_fc1 checked")
        return 1
    print(f"ok: {checked} per-rank layer tensors ({experts} of experts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
