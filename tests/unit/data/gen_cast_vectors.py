#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Generate cast_vectors.txt, the expectations of test_transform's casts.

Run with Debian's python, which has numpy and torch 1.13:

    /usr/bin/python3 tests/unit/data/gen_cast_vectors.py

Each line is one source element and what it converts to:

    <from> <source bits, hex> <to>=<bits, hex> ...

for every supported target type (reshard/cast.h).  The expectations never
come from our C code: they are computed here with exact rational
arithmetic (fractions.Fraction) by the rule cast.h states -- round once to
nearest, ties to even; overflow to infinity; NaN quiet with the sign and
the leading payload bits kept; integers modulo 2^bits -- and then checked
against numpy (float64/float32/float16 and the integer types) and torch
(bfloat16) wherever those libraries round once too.
"""

import os
import random
import struct
import sys
from fractions import Fraction

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

FLOATS = {'f64': (11, 52), 'f32': (8, 23), 'f16': (5, 10), 'bf16': (8, 7)}
INTS = {'i64': (64, True), 'i32': (32, True), 'i16': (16, True),
        'i8': (8, True), 'u64': (64, False), 'u32': (32, False),
        'u16': (16, False), 'u8': (8, False), 'bool': (1, False)}
NP = {'f64': np.float64, 'f32': np.float32, 'f16': np.float16,
      'i64': np.int64, 'i32': np.int32, 'i16': np.int16, 'i8': np.int8,
      'u64': np.uint64, 'u32': np.uint32, 'u16': np.uint16, 'u8': np.uint8}
ORDER = ['f64', 'f32', 'f16', 'bf16', 'i64', 'i32', 'i16', 'i8', 'u8',
         'bool', 'u16', 'u32', 'u64']


def width(t):
    if t in FLOATS:
        e, m = FLOATS[t]
        return 1 + e + m
    return 8 if t == 'bool' else INTS[t][0]


# ---------------------------------------------------------------- oracle

def decode(bits, fmt):
    """('zero'|'inf'|'nan'|'fin', negative, Fraction value | payload)."""
    e, m = fmt
    neg = (bits >> (e + m)) & 1 == 1
    ex = (bits >> m) & ((1 << e) - 1)
    frac = bits & ((1 << m) - 1)
    bias = (1 << (e - 1)) - 1
    if ex == (1 << e) - 1:
        return ('nan', neg, (frac, m)) if frac else ('inf', neg, None)
    if ex == 0:
        if frac == 0:
            return ('zero', neg, None)
        return ('fin', neg, Fraction(frac) * Fraction(2) ** (1 - bias - m))
    return ('fin', neg, Fraction(frac + (1 << m)) * Fraction(2) ** (ex - bias - m))


def floor_log2(x):
    """Largest k with 2^k <= x, for a positive Fraction x."""
    k = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** k > x:
        k -= 1
    while Fraction(2) ** (k + 1) <= x:
        k += 1
    return k


def encode(val, fmt):
    cls, neg, v = val
    e, m = fmt
    sign = (1 << (e + m)) if neg else 0
    inf = ((1 << e) - 1) << m
    if cls == 'zero':
        return sign
    if cls == 'inf':
        return sign | inf
    if cls == 'nan':
        payload, pm = v
        p = payload << (m - pm) if m >= pm else payload >> (pm - m)
        return sign | inf | (1 << (m - 1)) | p
    bias = (1 << (e - 1)) - 1
    emin = 1 - bias
    q = max(floor_log2(v), emin) - m          # exponent of the last bit
    scaled = v / Fraction(2) ** q
    n = scaled.numerator // scaled.denominator
    r = scaled - n
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2 == 1):
        n += 1
    if n == 0:
        return sign
    if Fraction(n) * Fraction(2) ** q >= Fraction(2) ** (bias + 1):
        return sign | inf
    if n < (1 << m):                          # subnormal
        return sign | n
    while n >= (1 << (m + 1)):                # the rounding carried
        n //= 2
        q += 1
    return sign | ((q + m + bias) << m) | (n - (1 << m))


def int_value(bits, t):
    if t == 'bool':
        return 1 if bits else 0
    w, signed = INTS[t]
    if signed and bits >> (w - 1):
        return bits - (1 << w)
    return bits


def expect(src_t, bits, dst_t):
    """Expected bits, or None when the pair is not supported."""
    if src_t == dst_t:
        return bits                           # a copy
    if src_t in FLOATS:
        if dst_t not in FLOATS:
            return None
        return encode(decode(bits, FLOATS[src_t]), FLOATS[dst_t])
    x = int_value(bits, src_t)
    if dst_t in FLOATS:
        val = ('zero', False, None) if x == 0 else ('fin', x < 0, Fraction(abs(x)))
        return encode(val, FLOATS[dst_t])
    if dst_t == 'bool':
        return 1 if x else 0
    return x % (1 << INTS[dst_t][0])


# ---------------------------------------------------------------- inputs

def float_inputs(t, rng):
    e, m = FLOATS[t]
    bias = (1 << (e - 1)) - 1
    top = 1 << (e + m)
    expmask = ((1 << e) - 1) << m
    out = {0, top, expmask, top | expmask,               # zeros, infinities
           expmask | 1, expmask | (1 << (m - 1)),        # sNaN, qNaN
           top | expmask | ((1 << m) - 1),               # -NaN, full payload
           expmask | (1 << (m - 1)) | rng.getrandbits(m - 1),
           1, (1 << m) - 1, 1 << m,                      # subnormals, min normal
           expmask - 1, top | (expmask - 1),             # +-max finite
           bias << m, top | (bias << m), (bias << m) | 1}  # +-1, 1 + ulp
    # ties, near-ties, overflow and underflow edges of every narrower type
    for u, (te, tm) in FLOATS.items():
        if tm >= m and te >= e:
            continue
        tbias = (1 << (te - 1)) - 1
        for _ in range(6):
            ex = rng.randint(max(1 - tbias, 1 - bias), min(tbias, bias))
            sig = (1 << tm) | rng.getrandbits(tm)
            base = Fraction(sig) * Fraction(2) ** (ex - tm)
            half = Fraction(2) ** (ex - tm - 1)
            for x in (base + half, base - half + Fraction(2) ** (ex - tm)):
                b = encode(('fin', rng.random() < 0.5, x), (e, m))
                out.update({b, b + 1, b - 1})
        tmax = (Fraction(2) - Fraction(2) ** -tm) * Fraction(2) ** tbias
        tiny = Fraction(2) ** (1 - tbias - tm)
        for x in (tmax, tmax + Fraction(2) ** (tbias - tm - 1), tiny / 2,
                  tiny, tiny * 3 / 2, Fraction(2) ** (1 - tbias)):
            if x < Fraction(2) ** (bias + 1):
                b = encode(('fin', False, x), (e, m))
                if b < expmask:
                    out.update({b, b + 1, b - 1, b | top})
    for _ in range(40):                                  # any bits
        out.add(rng.getrandbits(1 + e + m))
    for _ in range(40):                                  # ordinary values
        ex = rng.randint(-12, 12) + bias
        out.add((rng.getrandbits(1) << (e + m)) | (ex << m) | rng.getrandbits(m))
    return sorted(b for b in out if 0 <= b < (top << 1))


def int_inputs(t, rng):
    if t == 'bool':
        return [0, 1, 2, 0xff]
    w, signed = INTS[t]
    lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if signed else (0, (1 << w) - 1)
    vals = {0, 1, lo, hi, lo + 1, hi - 1}
    if signed:
        vals.update({-1, -2})
    for k in (8, 9, 11, 12, 24, 25, 53, 54, 62):
        for d in (-1, 0, 1, 3):
            for s in ((1, -1) if signed else (1,)):
                vals.add(s * ((1 << k) + d))
    for _ in range(12):
        vals.add(rng.randint(lo, hi))
    return sorted(v % (1 << w) for v in vals if lo <= v <= hi)


# ---------------------------------------------------------------- checks

def as_np(t, bits_list):
    w = width(t)
    raw = np.array(bits_list, dtype={8: np.uint8, 16: np.uint16,
                                     32: np.uint32, 64: np.uint64}[w])
    return raw.view(NP[t])


def np_bits(arr):
    w = arr.dtype.itemsize * 8
    return [int(x) for x in arr.view({8: np.uint8, 16: np.uint16,
                                      32: np.uint32, 64: np.uint64}[w])]


def cross_check(src, ins, dst, got):
    """Compare non-NaN results with numpy/torch where they round once."""
    ref = None
    with np.errstate(all='ignore'):
        if src in NP and dst in NP and not (src in FLOATS and dst not in FLOATS):
            if not (src in INTS and dst == 'f16'):  # numpy: via float
                ref = np_bits(as_np(src, ins).astype(NP[dst]))
    if 'bf16' in (src, dst) and src in FLOATS and dst in FLOATS and src != 'f64':
        if src == 'bf16':
            x = torch.tensor([b - (1 << 16) if b >> 15 else b for b in ins],
                             dtype=torch.int16).view(torch.bfloat16)
        else:
            x = torch.from_numpy(as_np(src, ins).copy())
        y = x.to({'bf16': torch.bfloat16, 'f32': torch.float32,
                  'f16': torch.float16, 'f64': torch.float64}[dst])
        w = width(dst)
        iv = y.view({16: torch.int16, 32: torch.int32, 64: torch.int64}[w])
        ref = [int(v) % (1 << w) for v in iv.tolist()]
    if ref is None:
        return None
    bad = 0
    for b, g, r in zip(ins, got, ref):
        if dst in FLOATS and decode(g, FLOATS[dst])[0] == 'nan':
            assert decode(r, FLOATS[dst])[0] == 'nan', (src, dst, hex(b))
            continue
        if g != r:
            bad += 1
            print(f'{src}->{dst} {b:#x}: oracle {g:#x}, library {r:#x}',
                  file=sys.stderr)
    return bad


def main():
    rng = random.Random(14)
    lines, bad, checked = [], 0, 0
    for src in ORDER:
        ins = float_inputs(src, rng) if src in FLOATS else int_inputs(src, rng)
        outs = {}
        for dst in ORDER:
            got = [expect(src, b, dst) for b in ins]
            if got[0] is None:
                continue
            outs[dst] = got
            n = cross_check(src, ins, dst, got)
            if n is not None:
                bad += n
                checked += 1
        for i, b in enumerate(ins):
            lines.append(' '.join([f'{src} {b:x}'] +
                                  [f'{d}={outs[d][i]:x}' for d in ORDER if d in outs]))
    if bad:
        sys.exit(f'{bad} disagreement(s) with numpy/torch')
    with open(os.path.join(HERE, 'cast_vectors.txt'), 'w') as f:
        f.write('# Generated by gen_cast_vectors.py: do not edit.\n')
        f.write('\n'.join(lines) + '\n')
    print(f'{len(lines)} source elements; {checked} type pairs '
          f'cross-checked with numpy/torch', file=sys.stderr)


if __name__ == '__main__':
    main()
