#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Generate the test vectors of test_pickle, test_zipitem and test_torchpkl.

Run with Debian's python, which has torch 1.13:

    /usr/bin/python3 tests/unit/data/gen_vectors.py

It writes, next to itself:
  pickle/*.pkl   pickles made by CPython's pickle at protocols 0-5, dicts
                 of numpy arrays (as Paddle saves them) and real DCP
                 .metadata files (torch 1.13 and 2.6)
  torch/*        torch.save archives and DCP data files (torch 1.13 and 2.6)
  torch/*.json   what each torch stage saw (kept so the header can be
                 rebuilt without the chroot: --header-only)
  vectors.h      the expectations, as C tables

The torch 2.6 stage runs the script again inside the Debian trixie chroot
at /opt/trixie (copied to /opt/trixie/tmp), when it exists.

Expectations never come from our C code:
  * pickles are decoded by CPython's own pure-Python unpickler with the
    class/call opcodes replaced by inert nodes (what pickle.c promises), and
    printed in a canonical text form that the C test prints too;
  * ZIP record offsets are the ones Python's zipfile uses to read records,
    cross-checked against the local header;
  * tensor metadata comes from the torch tensor that was saved.
"""

import collections
import dataclasses
import enum
import io
import json
import os
import pathlib
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHROOT = '/opt/trixie'
MAX_INLINE_DUMP = 3000
WALK_DEPTH = 64  # FLX_PV_MAX_WALK_DEPTH


def fnv64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


# ---------------------------------------------------------------- reference

class G:
    def __init__(self, module, name):
        self.module, self.name = module, name


class Obj:
    NOSTATE = object()

    def __init__(self, cls, args, newobj):
        self.cls, self.args, self.newobj = cls, args, newobj
        self.state = Obj.NOSTATE


class PSet(list):
    """A set, in pickle order (pickle.c keeps the order of ADDITEMS)."""


class Persid:
    def __init__(self, pid):
        self.pid = pid


class Inert(pickle._Unpickler):
    """CPython's pure-Python unpickler, with every opcode that would import
    or call something replaced by an inert node, as pickle.c does."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module, name):
        return G(module, name)

    def persistent_load(self, pid):
        return Persid(pid)

    @staticmethod
    def make(cls, args, newobj):
        if not isinstance(args, tuple):
            raise pickle.UnpicklingError('args not a tuple')
        if (isinstance(cls, G) and cls.module == 'collections' and
                cls.name == 'OrderedDict' and args == ()):
            return {}
        return Obj(cls, args, newobj)

    def _instantiate(self, klass, args):
        self.append(self.make(klass, tuple(args), False))

    def load_reduce(self):
        args = self.stack.pop()
        self.stack[-1] = self.make(self.stack[-1], args, False)
    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self):
        args = self.stack.pop()
        self.stack[-1] = self.make(self.stack[-1], args, True)
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        if kwargs:
            raise pickle.UnpicklingError('kwargs')
        self.stack[-1] = self.make(self.stack[-1], args, True)
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def load_build(self):
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(inst, Obj):
            inst.state = state
        elif not isinstance(inst, dict):
            raise pickle.UnpicklingError('BUILD on %r' % type(inst))
    dispatch[pickle.BUILD[0]] = load_build

    def load_empty_set(self):
        self.append(PSet())
    dispatch[pickle.EMPTY_SET[0]] = load_empty_set

    def load_additems(self):
        items = self.pop_mark()
        self.stack[-1].extend(items)
    dispatch[pickle.ADDITEMS[0]] = load_additems

    def load_frozenset(self):
        items = self.pop_mark()  # rebinds self.append
        self.append(PSet(items))
    dispatch[pickle.FROZENSET[0]] = load_frozenset


def esc(b):
    out = []
    for c in b:
        if 0x20 <= c < 0x7f and c not in (0x22, 0x5c):
            out.append(chr(c))
        else:
            out.append('\\x%02x' % c)
    return '"' + ''.join(out) + '"'


def dump(v, depth=0):
    """Canonical text of a decoded tree; test_pickle.c prints the same."""
    if depth >= WALK_DEPTH:
        return '~'
    d = depth + 1
    if v is None:
        return 'N'
    if v is True:
        return 'T'
    if v is False:
        return 'F'
    if isinstance(v, int):
        return 'i%d' % v if -2**63 <= v < 2**63 else 'I'
    if isinstance(v, float):
        return 'f' + struct.pack('>d', v).hex()
    if isinstance(v, str):
        return 's' + esc(v.encode('utf-8', 'surrogatepass'))
    if isinstance(v, (bytes, bytearray)):
        return 'b' + esc(bytes(v))
    if isinstance(v, tuple):
        return '(' + ','.join(dump(x, d) for x in v) + ')'
    if isinstance(v, PSet):
        return '{' + ','.join(dump(x, d) for x in v) + '}'
    if isinstance(v, list):
        return '[' + ','.join(dump(x, d) for x in v) + ']'
    if isinstance(v, dict):
        return '<' + ','.join(dump(k, d) + ':' + dump(x, d)
                              for k, x in v.items()) + '>'
    if isinstance(v, G):
        return 'g(' + esc(v.module.encode()) + ' ' + esc(v.name.encode()) + ')'
    if isinstance(v, Obj):
        st = '-' if v.state is Obj.NOSTATE else dump(v.state, d)
        return (('O(' if v.newobj else 'R(') + dump(v.cls, d) + ';' +
                dump(v.args, d) + ';' + st + ')')
    if isinstance(v, Persid):
        return 'P(' + dump(v.pid, d) + ')'
    raise TypeError(type(v))


def expect_of(data):
    text = dump(Inert(io.BytesIO(data)).load())
    if len(text) <= MAX_INLINE_DUMP:
        return text
    return 'fnv:%016x:%d' % (fnv64(text.encode()), len(text))


# ------------------------------------------------------------ pickle values

@dataclasses.dataclass
class Point:
    x: int
    y: float
    tags: list


class Tupled:
    """__getstate__ returning a tuple, like DCP TensorProperties."""

    def __init__(self):
        self.a, self.b = 1, 'two'

    def __getstate__(self):
        return (self.a, self.b)

    def __setstate__(self, st):
        self.a, self.b = st


class Reduced:
    def __reduce__(self):
        return (Reduced, (3, 'x'))

    def __init__(self, *a):
        pass


class Slotted:
    __slots__ = ('p', 'q')

    def __init__(self):
        self.p, self.q = 1, None


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def pickle_values():
    big_ints = [0, 1, 255, 256, 65535, 65536, -1, -256, -2**31, 2**31 - 1,
                2**31, -2**31 - 1, 2**63 - 1, -2**63, 2**63, -2**63 - 1,
                2**64, 10**30, -10**40, 2**2100 + 7, -(2**2100)]
    floats = [0.0, -0.0, 1.5, -2.25, 1e300, 5e-324, float('inf'),
              float('-inf'), float('nan'), 0.1]
    strs = ['', 'abc', 'caf\u00e9 \u20ac \U0001f600', 'x' * 300,
            'quote\'"\\back\nnl\r\0nul', 'L' * 255, 'M' * 256]
    byts = [b'', b'\x00\xff\x80', b'y' * 300, bytearray(b'ba\x00')]
    scalars = (big_ints, floats, strs, byts, None, True, False)
    inner = ('deep',)
    for _ in range(10):
        inner = (inner, len(inner))
    containers = {
        'tuples': ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), inner),
        'lists': ([], [1], [[], [[]]], list(range(5))),
        'dicts': ({}, {'a': 1}, {1: 'x', (1, 2): None, 'k': {'n': {}}}),
        'sets': (set(), {3}, frozenset(), frozenset({'f'})),
    }
    shared_s = 'shared string'
    shared_l = [1, 2]
    shared_t = (shared_l, 'tup')
    memo = [shared_s, shared_s, shared_l, shared_l, shared_t, shared_t,
            {'k': shared_s}]
    od = collections.OrderedDict([('w', 1), ('b', 2)])
    od._metadata = {'': {'version': 1}}
    objects = [Point(1, 2.5, ['a']), Tupled(), Reduced(), Slotted(),
               Color.BLUE, collections.OrderedDict(),
               collections.OrderedDict(a=1), od,
               pathlib.PurePosixPath('/tmp/ckpt'), complex(1, 2)]
    # Over 1000 items: APPENDS/SETITEMS/ADDITEMS come in batches of 1000.
    big = [[i % 200 for i in range(2050)], {i: None for i in range(1001)},
           set(range(1001))]
    return [('scalars', scalars, range(0, 6)),
            ('containers', containers, range(0, 6)),
            ('memo', memo, range(0, 6)),
            ('objects', objects, range(2, 6)),
            ('big', big, (2, 5))]


def pickle_stage(outdir):
    os.makedirs(outdir, exist_ok=True)
    names = []
    for name, value, protos in pickle_values():
        for proto in protos:
            fn = '%s_p%d.pkl' % (name, proto)
            data = pickle.dumps(value, protocol=proto)
            with open(os.path.join(outdir, fn), 'wb') as f:
                f.write(data)
            names.append(fn)
    return names


# ------------------------------------------------------------- numpy stage

def numpy_values():
    """A Paddle .distcp in small: a dict of numpy arrays (one over 64 KiB,
    so written outside the protocol-4 frame) and the name table."""
    import numpy as np
    rng = np.random.default_rng(14)
    return {
        'w': rng.standard_normal((100, 200)).astype(np.float32),
        'b': rng.standard_normal((3, 5)).astype(np.float32),
        'h': rng.integers(0, 65536, size=(8, 8), dtype=np.uint16),
        'StructuredToParameterName@@': {'w': 'linear_0.w_0',
                                        'b': 'linear_0.b_0',
                                        'h': 'embedding_0.w_0'},
    }


def numpy_stage(outdir):
    """numpy_p{2,4,5}.pkl: protocol 2 writes the bytes as
    _codecs.encode(str, 'latin1'), 4 as BINBYTES/SHORT_BINBYTES after
    _reconstruct, 5 as BYTEARRAY8 under _frombuffer."""
    value = numpy_values()
    for proto in (2, 4, 5):
        with open(os.path.join(outdir, 'numpy_p%d.pkl' % proto), 'wb') as f:
            pickle.dump(value, f, protocol=proto)


def numpy_payloads(pdir):
    """Where each array's bytes lie in numpy_p*.pkl, found by searching the
    file for the bytes of the array the real unpickler returns (protocol 2:
    for their latin-1 text encoded as UTF-8, which is what the file holds)."""
    import numpy as np
    out = []
    for fn in sorted(os.listdir(pdir)):
        if not fn.startswith('numpy_p'):
            continue
        with open(os.path.join(pdir, fn), 'rb') as f:
            data = f.read()
        for key, arr in pickle.loads(data).items():
            if not isinstance(arr, np.ndarray):
                continue
            raw = arr.tobytes()
            if data[1] == 2:
                raw = raw.decode('latin1').encode('utf-8')
            off = data.find(raw)
            assert off > 0 and data.find(raw, off + 1) < 0, (fn, key)
            out.append((fn, key, off, len(raw)))
    return out


# ------------------------------------------------------------- torch stage

def patch_dataclasses():
    """torch 1.13's _shard modules use a mutable dataclass default that
    CPython 3.11 refuses (docs/formats/dcp.md, item 1)."""
    orig = dataclasses._get_field

    def patched(cls, a_name, a_type, *rest):
        try:
            return orig(cls, a_name, a_type, *rest)
        except ValueError as e:
            if 'mutable default' not in str(e):
                raise
        default = getattr(cls, a_name, dataclasses.MISSING)
        if isinstance(default, dataclasses.Field):
            d = default.default
            if d is not dataclasses.MISSING and type(d).__hash__ is None:
                default.default = dataclasses.MISSING
                default.default_factory = lambda d=d: d
        elif (default is not dataclasses.MISSING and
              type(default).__hash__ is None):
            setattr(cls, a_name,
                    dataclasses.field(default_factory=lambda d=default: d))
        return orig(cls, a_name, a_type, *rest)
    dataclasses._get_field = patched


def describe_zip(win):
    """Records of one archive as Python's zipfile reads them."""
    zf = zipfile.ZipFile(io.BytesIO(win))
    infos = zf.infolist()
    prefix = infos[0].filename.split('/')[0]
    recs = []
    for info in infos:
        with zf.open(info) as f:
            doff = f._orig_compress_start
        h = info.header_offset
        n, m = struct.unpack('<HH', win[h + 26:h + 30])
        assert doff == h + 30 + n + m
        payload = win[doff:doff + info.file_size]
        assert payload == zf.read(info) or info.compress_type != 0
        recs.append(dict(rel=info.filename[len(prefix) + 1:], off=doff,
                         size=info.file_size, fnv=fnv64(payload)))
    return prefix, recs


def describe_tensor(t):
    try:
        nbytes = t.untyped_storage().nbytes()
    except AttributeError:
        nbytes = t.storage().nbytes()
    return dict(dtype=str(t.dtype)[len('torch.'):], size=list(t.shape),
                stride=list(t.stride()), offset=t.storage_offset(),
                key='0', storage_bytes=nbytes)


def torch_stage(outdir, tag):
    patch_dataclasses()
    import torch
    import warnings
    warnings.simplefilter('ignore')
    torch.manual_seed(0)
    os.makedirs(outdir, exist_ok=True)
    zips = []

    def save(name, t, pre=b'', post=b''):
        bio = io.BytesIO()
        bio.write(pre)
        torch.save(t, bio)
        end = bio.tell()
        bio.write(post)
        data = bio.getvalue()
        fn = '%s_%s.pt' % (tag, name)
        with open(os.path.join(outdir, fn), 'wb') as f:
            f.write(data)
        prefix, recs = describe_zip(data[len(pre):end])
        zips.append(dict(file=fn, win_off=len(pre), win_len=end - len(pre),
                         prefix=prefix, records=recs,
                         tensor=describe_tensor(t)))

    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    save('f32', base)
    save('bf16', torch.randn(2, 3).to(torch.bfloat16))
    save('f16', torch.randn(5).to(torch.float16))
    save('f64', torch.randn(2, 2, dtype=torch.float64))
    save('i64', torch.arange(-3, 3, dtype=torch.int64).reshape(2, 1, 3))
    save('i32', torch.tensor([1, -2, 2**31 - 1], dtype=torch.int32))
    save('i16', torch.tensor([7, -7], dtype=torch.int16))
    save('i8', torch.tensor([-128, 127, 0, 1], dtype=torch.int8))
    save('u8', torch.tensor([0, 255, 9], dtype=torch.uint8))
    save('bool', torch.tensor([True, False, True]))
    save('c64', torch.tensor([1 + 2j, -3j], dtype=torch.complex64))
    save('scalar', torch.tensor(7, dtype=torch.int64))
    save('transposed', base.t())
    save('offset', torch.arange(20, dtype=torch.float32)[5:9])
    save('empty', torch.empty(0, 3))
    save('window', torch.arange(6, dtype=torch.float32).reshape(2, 3),
         pre=b'\x55' * 1000, post=b'PK\x05\x06' + b'\xaa' * 40)
    if hasattr(torch, 'float8_e4m3fn'):
        save('f8e4m3', torch.tensor([0.5, -1.0, 2.0]).to(torch.float8_e4m3fn))
        save('f8e5m2', torch.tensor([1.0, 4.0]).to(torch.float8_e5m2))
    if hasattr(torch, 'uint16'):
        save('u16', torch.tensor([1, 65535]).to(torch.uint16))
        save('u32', torch.tensor([7, 2**32 - 1]).to(torch.uint32))

    # A real DCP checkpoint: its .metadata (a pickle with classes) and its
    # one data file holding several items at non-zero offsets.
    sd = {'w': torch.arange(12, dtype=torch.float32).reshape(3, 4),
          'b': torch.ones(2, dtype=torch.bfloat16), 'step': 5}
    import uuid  # StorageMeta.save_id: fixed, for reproducible bytes
    uuid.uuid4 = lambda: uuid.UUID(int=0x0123456789abcdef)
    ck = os.path.join(outdir, 'ck_tmp')
    shutil.rmtree(ck, ignore_errors=True)
    try:
        import torch.distributed.checkpoint as dcp
        dcp.save(sd, checkpoint_id=ck)
        reader = dcp.FileSystemReader(ck)
    except (ImportError, AttributeError):
        from torch.distributed._shard import checkpoint as dcp
        dcp.save_state_dict(sd, dcp.FileSystemWriter(
            ck, single_file_per_rank=True), no_dist=True)
        reader = dcp.FileSystemReader(ck)
    md = reader.read_metadata()
    shutil.copy(os.path.join(ck, '.metadata'),
                os.path.join(outdir, '%s_dcp_metadata.pkl' % tag))
    files = sorted({si.relative_path for si in md.storage_data.values()})
    assert files == ['__0_0.distcp'], files
    dfn = '%s_dcp.distcp' % tag
    shutil.copy(os.path.join(ck, files[0]), os.path.join(outdir, dfn))
    with open(os.path.join(outdir, dfn), 'rb') as f:
        ddata = f.read()
    for idx, si in sorted(md.storage_data.items(),
                          key=lambda kv: kv[1].offset):
        win = ddata[si.offset:si.offset + si.length]
        prefix, recs = describe_zip(win)
        v = sd[idx.fqn]
        zips.append(dict(file=dfn, win_off=si.offset, win_len=si.length,
                         prefix=prefix, records=recs,
                         tensor=describe_tensor(v)
                         if isinstance(v, torch.Tensor) else None))
    shutil.rmtree(ck)
    with open(os.path.join(outdir, '%s.json' % tag), 'w') as f:
        json.dump(dict(torch=torch.__version__, zips=zips), f)


# ------------------------------------------------------ hand-made archives

def stored_zip(path, comment=b'', deflate=False, dup=False):
    import warnings
    comp = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED

    def info(name):  # fixed timestamp: reproducible bytes
        zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        zi.compress_type = comp
        return zi
    with zipfile.ZipFile(path, 'w', compression=comp) as zf:
        zf.writestr(info('arch/data.pkl'), pickle.dumps(42, protocol=2))
        zf.writestr(info('arch/data/0'), b'\x01\x02\x03\x04' * 16)
        zf.writestr(info('arch/version'), b'3\n')
        if dup:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                zf.writestr(info('arch/data/0'), b'other')
        zf.comment = comment


def zip64_zip(path):
    """Every CD size/offset saturated and carried by ZIP64 extra fields,
    classic EOCD saturated, ZIP64 record + locator: the layout torch's
    miniz writes for items past 4 GiB, made small."""
    recs = [(b'z/data.pkl', pickle.dumps([1, 2], protocol=2)),
            (b'z/data/0', bytes(range(40))), (b'z/version', b'3\n')]
    out, cd = bytearray(), bytearray()
    for name, data in recs:
        lho = len(out)
        pad = b'FB' + struct.pack('<H', 6) + b'Z' * 6
        out += struct.pack('<IHHHHHIIIHH', 0x04034b50, 45, 0, 0, 0, 0,
                           zipfile.crc32(data), len(data), len(data),
                           len(name), len(pad)) + name + pad + data
        extra = struct.pack('<HHQQQ', 1, 24, len(data), len(data), lho)
        cd += struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 45, 45, 0, 0,
                          0, 0, zipfile.crc32(data), 0xffffffff,
                          0xffffffff, len(name), len(extra), 0, 0, 0, 0,
                          0xffffffff) + name + extra
    cd_off = len(out)
    out += cd
    z64 = len(out)
    out += struct.pack('<IQHHIIQQQQ', 0x06064b50, 44, 45, 45, 0, 0,
                       len(recs), len(recs), len(cd), cd_off)
    out += struct.pack('<IIQI', 0x07064b50, 0, z64, 1)
    out += struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, 0xffff, 0xffff,
                       0xffffffff, 0xffffffff, 0)
    with open(path, 'wb') as f:
        f.write(out)


def hand_stage(outdir):
    zips = []
    for fn, kw, err in (
            ('py_stored.zip', {}, None),
            ('py_comment.zip', {'comment': b'a zip comment ' * 5}, None),
            ('py_deflate.zip', {'deflate': True}, 'compressed (method 8)'),
            ('py_dup.zip', {'dup': True}, "'arch/data/0' appears twice")):
        path = os.path.join(outdir, fn)
        stored_zip(path, **kw)
        with open(path, 'rb') as f:
            data = f.read()
        prefix, recs = describe_zip(data)
        zips.append(dict(file=fn, win_off=0, win_len=len(data),
                         prefix=prefix, records=recs[:8], tensor=None,
                         err=err))
    path = os.path.join(outdir, 'hand_zip64.zip')
    zip64_zip(path)
    with open(path, 'rb') as f:
        data = f.read()
    prefix, recs = describe_zip(data)
    zips.append(dict(file='hand_zip64.zip', win_off=0, win_len=len(data),
                     prefix=prefix, records=recs, tensor=None))
    return zips


# ------------------------------------------------------------------ header

def c_str(s):
    return '"' + s.replace('\\', '\\\\').replace('"', '\\"') + '"'


def write_header(pkl_names, zips):
    L = ['/* SPDX-License-Identifier: MIT */',
         '/* Generated by gen_vectors.py: do not edit. */',
         '#ifndef FLX_TESTS_VECTORS_H', '#define FLX_TESTS_VECTORS_H', '',
         '#include <stdint.h>', '',
         '/* expect: canonical dump, or "fnv:<hash>:<len>" of it */',
         'struct pkl_vec {', '\tconst char *file;', '\tconst char *expect;',
         '};', '', 'static const struct pkl_vec pkl_vecs[] = {']
    for fn in pkl_names:
        with open(os.path.join(HERE, 'pickle', fn), 'rb') as f:
            exp = expect_of(f.read())
        L.append('\t{%s,' % c_str('pickle/' + fn))
        for i in range(0, len(exp), 64):
            L.append('\t ' + c_str(exp[i:i + 64]))
        L[-1] += '},'
    L += ['};', '',
          '/* numpy arrays of pickle/numpy_p*.pkl: where the bytes of each',
          ' * lie in the file (protocol 2: their latin-1 text, as UTF-8) */',
          'struct npy_vec {', '\tconst char *file;', '\tconst char *key;',
          '\tuint64_t off, len;', '};', '',
          'static const struct npy_vec npy_vecs[] = {']
    for fn, key, off, n in numpy_payloads(os.path.join(HERE, 'pickle')):
        L.append('\t{%s, %s, %d, %d},' % (c_str('pickle/' + fn), c_str(key),
                                          off, n))
    L += ['};', '',
          'struct zip_rec_vec {', '\tconst char *rel;',
          '\tuint64_t off, size, fnv;', '};', '',
          'struct zip_vec {',
          '\tconst char *file;', '\tuint64_t win_off, win_len;',
          '\tconst char *err; /* NULL: flx_zip_open must succeed */',
          '\tconst char *prefix;', '\tint nrec;',
          '\tstruct zip_rec_vec rec[8];',
          '\tint has_tensor;', '\tconst char *dtype;', '\tint ndim;',
          '\tint64_t size[4], stride[4], offset;', '\tconst char *key;',
          '\tuint64_t storage_bytes;', '};', '',
          'static const struct zip_vec zip_vecs[] = {']
    for z in zips:
        recs = ', '.join('{%s, %d, %d, 0x%016xu}' % (c_str(r['rel']),
                                                     r['off'], r['size'],
                                                     r['fnv'])
                         for r in z['records'])
        err = z.get('err')
        L.append('\t{%s, %d, %d, %s, %s, %d, {%s},' % (
            c_str('torch/' + z['file']), z['win_off'], z['win_len'],
            c_str(err) if err else 'NULL', c_str(z['prefix']),
            len(z['records']), recs))
        t = z['tensor']
        if t:
            L.append('\t 1, %s, %d, {%s}, {%s}, %d, %s, %d},' % (
                c_str(t['dtype']), len(t['size']),
                ', '.join(map(str, t['size'])) or '0',
                ', '.join(map(str, t['stride'])) or '0', t['offset'],
                c_str(t['key']), t['storage_bytes']))
        else:
            L.append('\t 0, 0, 0, {0}, {0}, 0, 0, 0},')
    L += ['};', '', '#endif', '']
    with open(os.path.join(HERE, 'vectors.h'), 'w') as f:
        f.write('\n'.join(L))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == '--torch-stage':
        torch_stage(sys.argv[2], sys.argv[3])
        return
    tdir = os.path.join(HERE, 'torch')
    pdir = os.path.join(HERE, 'pickle')
    if '--header-only' not in sys.argv:
        shutil.rmtree(tdir, ignore_errors=True)
        shutil.rmtree(pdir, ignore_errors=True)
        pickle_stage(pdir)
        numpy_stage(pdir)
        torch_stage(tdir, 't113')
        if os.path.isdir(CHROOT):
            work = os.path.join(CHROOT, 'tmp', 'flx-gen')
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            shutil.copy(os.path.abspath(__file__), work)
            subprocess.run(['chroot', CHROOT, 'python3',
                            '/tmp/flx-gen/gen_vectors.py', '--torch-stage',
                            '/tmp/flx-gen/out', 't26'], check=True)
            for fn in os.listdir(os.path.join(work, 'out')):
                shutil.copy(os.path.join(work, 'out', fn), tdir)
            shutil.rmtree(work)
        for fn in os.listdir(tdir):
            if fn.endswith('_dcp_metadata.pkl'):
                os.replace(os.path.join(tdir, fn), os.path.join(pdir, fn))
    with open(os.path.join(tdir, 'hand.json'), 'w') as f:
        json.dump(dict(zips=hand_stage(tdir)), f)
    zips = []
    for js in sorted(os.listdir(tdir)):
        if js.endswith('.json'):
            with open(os.path.join(tdir, js)) as f:
                zips += json.load(f)['zips']
    write_header(sorted(os.listdir(pdir)), zips)


if __name__ == '__main__':
    main()
