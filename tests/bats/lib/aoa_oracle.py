#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Oracle for aoa.bats: writes HF-named checkpoints (safetensors) and checks
what a mount with AOA statements serves against numpy/torch computing each
operation independently (docs/formats/paddle.md#aoa-statements).

  aoa_oracle.py gen DIR SEED         an HF Llama-like checkpoint + truth.npz
  aoa_oracle.py check MNT DIR CASE TP  the mount's ranks/ against CASE's truth
  aoa_oracle.py same MNT DIR         the mount (tp 1) serves exactly DIR's
                                     tensors, bit for bit (a round trip)
  aoa_oracle.py llama DIR SEED        a plain HF Llama checkpoint
  aoa_oracle.py random DIR SEED TP   random tensors (shapes, dtypes) and
                                     statements, one per operation, with a
                                     rules file splitting the targets over
                                     TP ranks where they divide; truth.pt
  aoa_oracle.py check-random MNT DIR TP
"""
import json
import os
import struct
import sys

import numpy as np
import torch

H, G, HD, HID, FF, L, V = 8, 2, 4, 32, 48, 3, 64
DT = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
      torch.float64: "F64"}
ST = {v: k for k, v in DT.items()}


def to_np(t):
    """A tensor's exact bits (bf16 as uint16)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def write_st(path, tensors):
    hdr, off, blobs = {}, 0, []
    for k, t in tensors.items():
        b = to_np(t.contiguous()).tobytes()
        hdr[k] = {"dtype": DT[t.dtype], "shape": list(t.shape),
                  "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(path):
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    for k, m in hdr.items():
        if k == "__metadata__":
            continue
        a, b = m["data_offsets"]
        buf = bytearray(data[a:b])
        t = torch.frombuffer(buf, dtype=ST[m["dtype"]]) if b > a else \
            torch.zeros(0, dtype=ST[m["dtype"]])
        out[k] = t.reshape(m["shape"])
    return out


def hf_model(seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, dt=torch.bfloat16: torch.randn(*s, generator=g).to(dt)
    m = {"model.embed_tokens.weight": r(V, HID),
         "model.norm.weight": r(HID, dt=torch.float32),
         "lm_head.weight": r(V, HID)}
    for i in range(L):
        p = f"model.layers.{i}."
        m[p + "self_attn.q_proj.weight"] = r(H * HD, HID)
        m[p + "self_attn.k_proj.weight"] = r(G * HD, HID)
        m[p + "self_attn.v_proj.weight"] = r(G * HD, HID)
        m[p + "self_attn.o_proj.weight"] = r(HID, H * HD)
        m[p + "mlp.gate_proj.weight"] = r(FF, HID)
        m[p + "mlp.up_proj.weight"] = r(FF, HID)
        m[p + "mlp.down_proj.weight"] = r(HID, FF)
        m[p + "mlp.gate.weight"] = r(4, HID, dt=torch.float64)
        m[p + "input_layernorm.weight"] = r(HID, dt=torch.float32)
    return m


def fuse_qkv(q, k, v, axis, groups=G):
    """PaddleNLP fuse_param_func(is_qkv=True): per KV group g of groups,
    [Q heads of g, K_g, V_g] along axis."""
    qs, ks, vs = (torch.chunk(t, groups, dim=axis) for t in (q, k, v))
    return torch.cat([x for i in range(groups)
                      for x in (qs[i], ks[i], vs[i])], dim=axis)


def fuse_ffn(gate, up, tp, axis):
    gs, us = torch.chunk(gate, tp, dim=axis), torch.chunk(up, tp, dim=axis)
    return torch.cat([x for r in range(tp) for x in (gs[r], us[r])],
                     dim=axis)


def paddle_linears(m, p, q, ffn, tp):
    """HF layer p's linears as PaddleNLP holds them under prefix q:
    transposed, qkv_proj interleaved per KV group (fuse_qkv), gate and up
    fused per TP rank (fuse_ffn) as ffn."""
    w = lambda n: m[p + n].T
    return {
        q + "self_attn.qkv_proj.weight": fuse_qkv(
            w("self_attn.q_proj.weight"), w("self_attn.k_proj.weight"),
            w("self_attn.v_proj.weight"), 1),
        q + "self_attn.o_proj.weight": w("self_attn.o_proj.weight"),
        q + ffn: fuse_ffn(w("mlp.gate_proj.weight"), w("mlp.up_proj.weight"),
                          tp, 1),
        q + "mlp.down_proj.weight": w("mlp.down_proj.weight")}


def expected(m, case, tp):
    """The tensors CASE's statements (aoa.bats) must give from m."""
    out = {}
    if case == "paddle":
        # HF -> PaddleNLP: transposed linears, fused qkv (axis 1) and
        # gate_up per TP rank, router kept fp32, tied head fanned out
        for i in range(L):
            p = f"model.layers.{i}."
            out.update(paddle_linears(m, p, p, "mlp.up_gate_proj.weight", tp))
            out[p + "mlp.gate.weight"] = m[p + "mlp.gate.weight"].to(
                torch.float32)
            out[p + "input_layernorm.weight"] = m[p + "input_layernorm.weight"]
        out["model.embed_tokens.weight"] = m["model.embed_tokens.weight"]
        out["lm_head.weight"] = m["model.embed_tokens.weight"]
        out["model.norm.weight"] = m["model.norm.weight"].to(torch.bfloat16)
    elif case == "paddlenlp-fused":
        # the hf-llama-to-paddlenlp-llama-fused preset: llama.* names,
        # transposed linears, qkv_proj interleaved per KV group, the merged
        # gate_up_fused_proj [gate | up] whose TP rank r holds
        # [gate_r | up_r] (so the ranks joined give fuse_ffn's layout)
        out["llama.embed_tokens.weight"] = m["model.embed_tokens.weight"]
        out["llama.norm.weight"] = m["model.norm.weight"]
        out["lm_head.weight"] = m["lm_head.weight"].T
        for i in range(L):
            p, q = f"model.layers.{i}.", f"llama.layers.{i}."
            for n in ("input_layernorm.weight",
                      "post_attention_layernorm.weight"):
                out[q + n] = m[p + n]
            out.update(paddle_linears(m, p, q, "mlp.gate_up_fused_proj.weight",
                                      tp))
    elif case == "concat":
        # concatenate then re-split along the other axis (boxes straddle
        # the boundary), name[a:b], prefix*suffix, $LAYER_ID_OFFSET
        s = torch.cat([m[f"model.layers.{i}.mlp.gate_proj.weight"]
                       for i in range(L)], dim=1)
        for j, d in enumerate(torch.chunk(s, 4, dim=0)):
            out[f"cut_{j}"] = d
        for i in range(1, L):
            out[f"shifted.{i - 1}.down"] = m[
                f"model.layers.{i}.mlp.down_proj.weight"]
        out["model.layers.0.mlp.down_proj.weight"] = m[
            "model.layers.0.mlp.down_proj.weight"]
        out["rq"] = m["model.layers.0.self_attn.q_proj.weight"].reshape(
            4, 8, 2, 16)
        out["lay.0.q"] = m["model.layers.1.self_attn.q_proj.weight"]
        out["lay.1.q"] = m["model.layers.2.self_attn.q_proj.weight"].reshape(
            1, 32, 1, 32, 1)
        out["norms"] = torch.cat([m[f"model.layers.{i}.input_layernorm.weight"]
                                  for i in range(L)], dim=0)
    return out


FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def rand_case(seed, tp):
    """(source tensors, statements, expected targets): every operation on
    random shapes and dtypes, the expected result computed by torch."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    src, st, exp = {}, [], {}

    def t(shape, dt=None):
        dt = dt or FLOATS[rng.integers(len(FLOATS))]
        x = (torch.randn(*shape, generator=g) * 100).to(dt)
        name = f"src.{len(src)}.w"
        src[name] = x
        return name, x

    def ext(k=1):
        return int(rng.integers(1, 5)) * k

    # rename, transpose by ^T and permute, cast (every float pair)
    n, x = t((ext(), ext()))
    st.append(f"{n} -> ren"); exp["ren"] = x
    n, x = t((ext(), ext(tp)))
    st.append(f"{n}^T -> tt"); exp["tt"] = x.T
    n, x = t((ext(), ext(), ext(tp)))
    p = [int(v) for v in rng.permutation(3)]
    st.append(f"{n} -> perm, permute='[{','.join(map(str, p))}]'")
    exp["perm"] = x.permute(*p)
    for i, a in enumerate(FLOATS):
        for j, b in enumerate(FLOATS):
            if a != b:
                n, x = t((ext(), 3 * tp), a)
                st.append(f"{n} -> cast_{i}{j}, dtype='{str(b)[6:]}'")
                exp[f"cast_{i}{j}"] = x.to(b)
    # concat of 2..4 inputs along a random axis, then re-split along
    # another axis and along the same one (boxes straddle the seams)
    dt = FLOATS[rng.integers(4)]
    nd = int(rng.integers(2, 4))
    ax = int(rng.integers(nd))
    base = [ext(tp) for _ in range(nd)]
    k = int(rng.integers(2, 5))
    ins = []
    for _ in range(k):
        sh = list(base)
        sh[ax] = ext()
        ins.append(t(tuple(sh), dt))
    st.append(f"{', '.join(n for n, _ in ins)} -> cat, axis={ax}")
    cat = torch.cat([x for _, x in ins], ax)
    parts = [d for d in range(1, 7) if cat.shape[ax] % d == 0 and d > 1]
    m = parts[int(rng.integers(len(parts)))] if parts else 1
    st.append(f"cat -> piece[0:{m}], axis={ax}")
    for i, y in enumerate(torch.chunk(cat, m, ax)):
        exp[f"piece_{i}"] = y
    # equal split
    n, x = t((ext(3), ext(tp)))
    st.append(f"{n} -> sp_a, sp_b, sp_c, axis=0")
    for nm, y in zip(("sp_a", "sp_b", "sp_c"), torch.chunk(x, 3, 0)):
        exp[nm] = y
    # reshape (row-major), both ways
    a_, b_, c_ = ext(), ext(), ext(tp)
    n, x = t((a_ * b_, c_))
    st.append(f"{n} -> rs, reshape='[{a_},{b_},{c_}]'")
    exp["rs"] = x.reshape(a_, b_, c_)
    n, x = t((a_, b_, c_))
    st.append(f"{n} -> rm, reshape='[-1,{c_}]'")
    exp["rm"] = x.reshape(-1, c_)
    # fused_qkv both ways (random H, G, head dim; axis 0 or 1)
    G = int(rng.integers(1, 4))
    H = G * int(rng.integers(1, 4))
    hd, hid = ext(), ext(tp)
    q, xq = t((H * hd, hid), dt)
    kk, xk = t((G * hd, hid), dt)
    v, xv = t((G * hd, hid), dt)
    st.append(f"{q}^T, {kk}^T, {v}^T -> qkv, fused_qkv, num_heads={H}, "
              f"num_key_value_groups={G}")
    exp["qkv"] = fuse_qkv(xq.T, xk.T, xv.T, 1, G)
    # optimizer states follow: moments through the same statement (their
    # dtype kept), the beta powers from the first source
    mom = [torch.randn(*y.shape, generator=g) for y in (xq, xk, xv)]
    for nm, y in zip((q, kk, v), mom):
        src[nm + ".moment1_0"] = y
        src[nm + ".beta1_pow_acc_0"] = torch.randn(1, generator=g)
    exp["qkv.moment1_0"] = fuse_qkv(*(y.T for y in mom), 1, G)
    exp["qkv.beta1_pow_acc_0"] = src[q + ".beta1_pow_acc_0"]
    n, x = t(((H + 2 * G) * hd, hid), dt)
    st.append(f"{n} -> q2, k2, v2, fused_qkv, num_heads={H}, "
              f"num_key_value_groups={G}, axis=0")
    grp = torch.chunk(x, G, 0)
    exp["q2"] = torch.cat([y[:H // G * hd] for y in grp], 0)
    exp["k2"] = torch.cat([y[H // G * hd:(H // G + 1) * hd] for y in grp], 0)
    exp["v2"] = torch.cat([y[(H // G + 1) * hd:] for y in grp], 0)
    # fused_qkv_old: per TP rank [Q_r | K_r | V_r]
    src_tp = int(rng.integers(1, 3))
    Ho, Go = src_tp * int(rng.integers(1, 3)), src_tp
    n, x = t(((Ho + 2 * Go) * hd, hid), dt)
    st.append(f"{n} -> q3, k3, v3, fused_qkv_old, num_heads={Ho}, "
              f"num_key_value_groups={Go}, axis=0, src_tp={src_tp}")
    rk = torch.chunk(x, src_tp, 0)
    hq, hk = Ho // src_tp * hd, Go // src_tp * hd
    exp["q3"] = torch.cat([y[:hq] for y in rk], 0)
    exp["k3"] = torch.cat([y[hq:hq + hk] for y in rk], 0)
    exp["v3"] = torch.cat([y[hq + hk:] for y in rk], 0)
    # fused_ffn: per TP rank [gate_r | up_r], relaid out from src_tp to tp
    f = tp * src_tp * ext()
    gt, xg = t((hid, f), dt)
    up, xu = t((hid, f), dt)
    st.append(f"{gt}, {up} -> gu, fused_ffn")
    exp["gu"] = fuse_ffn(xg, xu, tp, 1)
    st.append(f"{gt}, {up} -> t1, fused_ffn")
    st.append(f"t1 -> gu_src, fused_ffn, src_tp={tp}, dst_tp={src_tp}")
    exp["gu_src"] = fuse_ffn(xg, xu, src_tp, 1)
    st.append(f"{gt}, {up} -> t2, fused_ffn, dst_tp={src_tp}")
    st.append(f"t2 -> g4, u4, fused_ffn, src_tp={src_tp}")
    exp["g4"], exp["u4"] = xg, xu
    # tied fan-out and drop
    n, x = t((ext(), ext()))
    st.append(f"{n} -> tied_a")
    st.append(f"{n} -> tied_b")
    exp["tied_a"] = exp["tied_b"] = x
    n, x = t((2, 2))
    st.append(f"{n} -> _")
    # the rest of the grammar (docs/formats/paddle.md#aoa-statements): permute="[]" reverses
    # every axis; axis= on a 1->1 statement is ignored; the old syntax
    # "dst <- src"; ^T then a cast in one statement; '*' expands sorted
    # numerically (10 after 9, not after 1); $EXPERT_ID over the ids
    n, x = t((ext(), ext(), ext(tp)))
    st.append(f'{n} -> rev, permute="[]"'); exp["rev"] = x.permute(2, 1, 0)
    n, x = t((ext(), ext(tp)))
    st.append(f"{n} -> idn, axis=1"); exp["idn"] = x
    n, x = t((ext(), ext(tp)))
    st.append(f"old <- {n}"); exp["old"] = x
    n, x = t((ext(tp), ext()), torch.bfloat16)
    st.append(f"{n}^T -> tcast, dtype='float32'")
    exp["tcast"] = x.T.to(torch.float32)
    rows, cols, parts = ext(), ext(tp), []
    for i in range(12):
        parts.append((torch.randn(rows, cols, generator=g) * 9).to(
            torch.float16))
        src[f"ex.{i}.w"] = parts[-1]
    st.append("ex.*.w -> star, axis=0"); exp["star"] = torch.cat(parts, 0)
    for i in range(3):
        src[f"moe.{i}.w"] = (torch.randn(ext(), ext(tp), generator=g)).to(
            torch.float32)
        exp[f"moeT.{i}.w"] = src[f"moe.{i}.w"].T
    st.append("moe.$EXPERT_ID.w^T -> moeT.$EXPERT_ID.w")
    return src, st, exp


def rand_rules(exp, tp):
    rules = []
    for k, x in exp.items():
        axes = [d for d in range(x.dim()) if x.shape[d] % tp == 0]
        rules.append({"match": k, "split": axes[-1] if axes else None})
    return rules


def served(mnt, tp):
    """The global tensors the mount's ranks/ serve, TP shards joined along
    the axis where they differ (the rank boxes come from index.json)."""
    idx = json.load(open(os.path.join(mnt, "index.json")))
    parts = {}
    for r in range(tp):
        d = os.path.join(mnt, "ranks", f"tp{r:02d}_pp00")
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                for k, t in read_st(os.path.join(d, f)).items():
                    parts.setdefault(k, []).append(t)
    out = {}
    for k, ts in parts.items():
        info = idx["tensors"].get(k, {}) if isinstance(idx.get("tensors"), dict) else {}
        ax = info.get("split_axis", info.get("tp_axis"))
        if ax is None and len(ts) > 1:
            same = all(torch.equal(to_t(ts[0]), to_t(x)) and
                       ts[0].shape == x.shape for x in ts[1:])
            ax = None if same else next(
                (d for d in range(ts[0].dim())
                 if any(x.shape[d] != ts[0].shape[d] for x in ts[1:])), 0)
        out[k] = ts[0] if ax is None or len(ts) == 1 else torch.cat(ts, ax)
    return out


def to_t(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def write_dir(d, tensors):
    """d/model.safetensors holding tensors (d made where missing)."""
    os.makedirs(d, exist_ok=True)
    write_st(os.path.join(d, "model.safetensors"), tensors)


def main():
    if sys.argv[1] == "gen":
        d, seed = sys.argv[2], int(sys.argv[3])
        write_dir(d, hf_model(seed))
        return 0
    if sys.argv[1] == "llama":
        # a plain HF Llama (no router, gate or cast): the presets' domain
        d, seed = sys.argv[2], int(sys.argv[3])
        m = {k: v for k, v in hf_model(seed).items()
             if not k.endswith("mlp.gate.weight")}
        for i in range(L):
            m[f"model.layers.{i}.post_attention_layernorm.weight"] = \
                m[f"model.layers.{i}.input_layernorm.weight"] * 2
        write_dir(d, m)
        return 0
    if sys.argv[1] == "random":
        d, seed, tp = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        src, st, exp = rand_case(seed, tp)
        write_dir(d, src)
        with open(os.path.join(d, "..", f"rules{seed}.json"), "w") as f:
            json.dump({"aoa_statements": st,
                       "rules": rand_rules(exp, tp)}, f, indent=1)
        torch.save(exp, os.path.join(d, "..", f"truth{seed}.pt"))
        return 0
    if sys.argv[1] == "check-random":
        mnt, d, seed, tp = sys.argv[2], sys.argv[3], int(sys.argv[4]), \
            int(sys.argv[5])
        want = torch.load(os.path.join(d, "..", f"truth{seed}.pt"))
        got = served(mnt, tp)
        extra = set(got) - set(want)
        if extra:
            print(f"served but not expected: {sorted(extra)}")
            return 1
        case = None
    elif sys.argv[1] == "same":
        mnt, d, case, tp = sys.argv[2], sys.argv[3], None, 1
        want = read_st(os.path.join(d, "model.safetensors"))
    else:
        mnt, d, case, tp = sys.argv[2], sys.argv[3], sys.argv[4], \
            int(sys.argv[5])
        want = expected(read_st(os.path.join(d, "model.safetensors")), case,
                        tp)
    got = served(mnt, tp)
    if case is None and set(got) != set(want):
        print("names differ: extra %s, missing %s" % (
            sorted(set(got) - set(want)), sorted(set(want) - set(got))))
        return 1
    bad = 0
    for k, t in want.items():
        if k not in got:
            print(f"missing {k}")
            bad += 1
        elif got[k].dtype != t.dtype or got[k].shape != t.shape or \
                not torch.equal(to_t(got[k]), to_t(t.contiguous())):
            print(f"differs {k}: {got[k].dtype} {tuple(got[k].shape)} vs "
                  f"{t.dtype} {tuple(t.shape)}")
            bad += 1
    print(f"checked {len(want)} tensors, {bad} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
