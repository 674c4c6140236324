#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""aoa_megatron_check.py MNT TRUTH: the HF names a megatron-gpt-to-hf-llama
mount serves (ranks/tp00_pp00, tp 1) against the fixture's truth (legacy
per-layer .npy files), the Llama layouts computed here with numpy: q/k/v
from Megatron's per-query-group [q heads | k | v] rows, gate/up the two
halves of linear_fc1."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from aoa_oracle import read_st, to_np  # noqa: E402


def main():
    mnt, truth = sys.argv[1], sys.argv[2]
    man = json.load(open(os.path.join(truth, "manifest.json")))
    H, G = man["config"]["heads"], man["config"]["groups"]
    t = lambda n: np.load(os.path.join(truth, "model", n + ".npy"))
    got = {k: to_np(v) for k, v in
           read_st(os.path.join(mnt, "ranks", "tp00_pp00",
                                "model.safetensors")).items()}
    want = {"model.embed_tokens.weight": t("embedding.word_embeddings.weight"),
            "model.norm.weight": t("decoder.final_layernorm.weight"),
            "lm_head.weight": t("output_layer.weight")}
    L = 0
    while os.path.exists(os.path.join(
            truth, "model", f"decoder.layers.{L}.input_layernorm.weight.npy")):
        L += 1
    for i in range(L):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = t(m + "self_attention.linear_qkv.weight")
        grp = qkv.reshape(G, -1, qkv.shape[-1])
        hd = grp.shape[1] // (H // G + 2)
        want[h + "self_attn.q_proj.weight"] = grp[:, :H // G * hd].reshape(
            -1, qkv.shape[-1])
        want[h + "self_attn.k_proj.weight"] = grp[
            :, H // G * hd:(H // G + 1) * hd].reshape(-1, qkv.shape[-1])
        want[h + "self_attn.v_proj.weight"] = grp[
            :, (H // G + 1) * hd:].reshape(-1, qkv.shape[-1])
        fc1 = t(m + "mlp.linear_fc1.weight")
        want[h + "mlp.gate_proj.weight"] = fc1[:fc1.shape[0] // 2]
        want[h + "mlp.up_proj.weight"] = fc1[fc1.shape[0] // 2:]
        want[h + "mlp.down_proj.weight"] = t(m + "mlp.linear_fc2.weight")
        want[h + "self_attn.o_proj.weight"] = t(
            m + "self_attention.linear_proj.weight")
        want[h + "input_layernorm.weight"] = t(m + "input_layernorm.weight")
        want[h + "post_attention_layernorm.weight"] = t(
            m + "pre_mlp_layernorm.weight")
    bad = sorted(set(got) ^ set(want))
    for k, v in want.items():
        if k in got and (got[k].shape != v.shape or
                         got[k].tobytes() != v.tobytes()):
            bad.append(k)
    print(f"checked {len(want)} tensors ({L} layers, {H} heads, {G} groups), "
          f"{len(bad)} wrong {bad[:5]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
