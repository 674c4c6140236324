# SPDX-License-Identifier: MIT
"""The benchmark's model: llama-like shapes, bf16, deterministic data.

Shared by the generator (under torch 1.13 or 2.6), the torch baseline and
the byte checks.  No torch import here: numpy only (1.x and 2.x).

The data of a tensor is a pure function of (seed, fqn): PCG64 seeded from
sha256(seed:fqn), uint16 words with bit 14 cleared, i.e. bf16 values with
|x| < 2 and never inf/nan.  Regenerating a tensor is the ground truth.
"""

import hashlib
import math

import numpy as np

SEED = 20240611

# Presets.  "tinyllama" is TinyLlama-1.1B's geometry (22 layers of it is
# 2.2 GB of bf16, the default --size 2G); the layer count follows --size.
# "mini" is for the quick mode: small, with an odd vocabulary so that TP3/
# TP4/TP8 views have uneven (torch.chunk) shards.
PRESETS = {
    "tinyllama": dict(dim=2048, ffn=5632, n_heads=32, n_kv_heads=4, vocab=32000),
    "mini": dict(dim=128, ffn=352, n_heads=4, n_kv_heads=2, vocab=1003),
    # the mount-latency checkpoint: many tiny tensors
    "many": dict(dim=16, ffn=48, n_heads=2, n_kv_heads=1, vocab=64),
}

# (suffix, shape builder, source TP split axis or None = replicated)
LAYER_TENSORS = [
    ("attention.wq.weight", lambda c: (c["dim"], c["dim"]), 0),
    ("attention.wk.weight", lambda c: (c["kv"], c["dim"]), 0),
    ("attention.wv.weight", lambda c: (c["kv"], c["dim"]), 0),
    ("attention.wo.weight", lambda c: (c["dim"], c["dim"]), 1),
    ("feed_forward.w1.weight", lambda c: (c["ffn"], c["dim"]), 0),
    ("feed_forward.w2.weight", lambda c: (c["dim"], c["ffn"]), 1),
    ("feed_forward.w3.weight", lambda c: (c["ffn"], c["dim"]), 0),
    ("attention_norm.weight", lambda c: (c["dim"],), None),
    ("ffn_norm.weight", lambda c: (c["dim"],), None),
]


def parse_size(s):
    """'2G', '500M', '64k', '12345' -> bytes (binary units)."""
    s = str(s).strip()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if s and s[-1].lower() in mult:
        return int(float(s[:-1]) * mult[s[-1].lower()])
    return int(s)


def config(preset, size_bytes=None, layers=None):
    """Model geometry; layers = the fewest reaching size_bytes (>= 1)."""
    c = dict(PRESETS[preset])
    c["preset"] = preset
    c["kv"] = c["n_kv_heads"] * (c["dim"] // c["n_heads"])
    fixed = 2 * (2 * c["vocab"] * c["dim"] + c["dim"])
    per_layer = 2 * sum(math.prod(f(c)) for _, f, _ in LAYER_TENSORS)
    if layers is None:
        layers = max(1, -(-(size_bytes - fixed) // per_layer))
    c["layers"] = int(layers)
    c["bytes"] = fixed + per_layer * c["layers"]
    return c


def tensors(c, limit=None):
    """[(fqn, shape, split_axis_or_None)] in state-dict order (the first
    `limit` of them when given)."""
    out = [("tok_embeddings.weight", (c["vocab"], c["dim"]), 0)]
    for n in range(c["layers"]):
        for suf, f, ax in LAYER_TENSORS:
            out.append(("layers.%d.%s" % (n, suf), f(c), ax))
    out.append(("norm.weight", (c["dim"],), None))
    out.append(("output.weight", (c["vocab"], c["dim"]), 0))
    return out[:limit] if limit else out


def data(fqn, shape, seed=SEED):
    """The tensor's bf16 bits as a C-contiguous uint16 array."""
    h = hashlib.sha256(("%d:%s" % (seed, fqn)).encode()).digest()
    g = np.random.Generator(np.random.PCG64(int.from_bytes(h[:16], "little")))
    n = math.prod(shape)
    a = g.integers(0, 1 << 16, size=n, dtype=np.uint16)
    a &= np.uint16(0xBFFF)
    return a.reshape(shape)


# The "transposed" checkpoint (figure transposed): every weight saved as
# base.t(), base a C-contiguous bf16 tensor of base_shape, as torch DCP
# writes a transposed view: as-is, item stride (1, rows).  The saved
# (logical) tensor is base.T, of shape base_shape reversed.  split: the
# logical axis along which it is saved as 2 TP chunks on 2 ranks, each chunk
# itself a transposed view; None: one whole chunk (ranks alternate).  The
# last two have odd sizes (uneven torch.chunk halves).


def transposed_config(n):
    """Geometry of the transposed checkpoint for base dimension n (4096:
    8 tensors, 256 MiB).  JSON-safe (lists): it is the cache stamp's key."""
    h = n // 2
    t = [("transposed.0.whole.weight", (n, n), None),
         ("transposed.1.whole.weight", (n, n), None),
         ("transposed.2.split0.weight", (n, n), 0),
         ("transposed.3.split1.weight", (n, n), 1),
         ("transposed.4.whole.weight", (h, 2 * n), None),
         ("transposed.5.split0.weight", (2 * n, h), 0),
         ("transposed.6.split1.weight", (n - 5, n + 5), 1),
         ("transposed.7.split0.weight", (n + 3, n - 3), 0)]
    return dict(kind="transposed", n=n, dtype="bfloat16",
                tensors=[[f, list(s), a] for f, s, a in t],
                bytes=2 * sum(math.prod(s) for _, s, _ in t))


def transposed_data(fqn, base_shape, seed=SEED):
    """The saved tensor's bf16 bits: base.T, a (non-contiguous) view of the
    C-contiguous base."""
    return data(fqn, tuple(base_shape), seed).T


def chunk_boxes(n, parts):
    """torch.chunk / DTensor Shard: chunk = ceil(n/parts); [(off, size)]."""
    c = -(-n // parts) if n else 0
    out = []
    for i in range(parts):
        off = min(i * c, n)
        out.append((off, max(0, min((i + 1) * c, n) - off)))
    return out


def target_box(shape, axis, tp, r):
    """Global (offsets, sizes) of target TP rank r's shard (axis None:
    replicated, the whole tensor)."""
    offs, sizes = [0] * len(shape), list(shape)
    if axis is not None:
        o, s = chunk_boxes(shape[axis], tp)[r]
        offs[axis], sizes[axis] = o, s
    return tuple(offs), tuple(sizes)


def box_slice(offs, sizes):
    return tuple(slice(o, o + s) for o, s in zip(offs, sizes))
