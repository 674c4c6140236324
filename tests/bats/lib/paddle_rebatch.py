#!/usr/bin/env python3
"""Re-pickle a Paddle {id}.metadata in place, as pickle's own Python
pickler writes it with a given batch size (lists and dicts go out in
APPENDS/SETITEMS batches of at most N items; a last batch of one item is a
lone APPEND/SETITEM), optionally damaged:

  paddle_rebatch.py METADATA N [--dtype KEY DTYPE] [--replica KEY R]
                              [--require-tails]

--dtype sets the dtype of KEY's first LocalTensorMetadata, --replica the
replica_id of KEY's first storage entry.  --require-tails fails unless the
output has a list of state_dict_metadata and the storage_metadata dict
whose last item is added alone (what a streaming reader cannot take in
batches).  The classes are stand-ins made on demand under the pickle's own
module paths, whose state is kept as a dict, so the objects' fields are the
file's.  /usr/bin/python3.
"""

import argparse
import pickle
import sys
import types

PADDLE = ("paddle.distributed.flex_checkpoint.dcp.metadata",
          "paddle.distributed.checkpoint.metadata")


class Loader(pickle.Unpickler):
    def find_class(self, module, name):
        if module not in PADDLE:
            return super().find_class(module, name)
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            name_i = ".".join(parts[:i])
            if name_i not in sys.modules:
                sys.modules[name_i] = types.ModuleType(name_i)
                if i > 1:
                    setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1],
                            sys.modules[name_i])
        mod = sys.modules[module]
        cls = getattr(mod, name, None)
        if cls is None:
            cls = type(name, (), {"__module__": module, "__qualname__": name})
            setattr(mod, name, cls)
        return cls


def fields(o):
    return o.__dict__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("batch", type=int)
    ap.add_argument("--dtype", nargs=2)
    ap.add_argument("--replica", nargs=2)
    ap.add_argument("--require-tails", action="store_true")
    a = ap.parse_args()
    with open(a.path, "rb") as f:
        m = Loader(f).load()
    sdm, sm = fields(m)["state_dict_metadata"], fields(m)["storage_metadata"]
    if a.dtype:
        fields(sdm[a.dtype[0]][0])["dtype"] = a.dtype[1]
    if a.replica:
        k = next(x for x in sm if fields(x)["tensor_key"] == a.replica[0])
        fields(k)["replica_id"] = int(a.replica[1])
    if a.require_tails:
        odd = [len(v) for v in sdm.values()
               if isinstance(v, list) and len(v) > a.batch and len(v) % a.batch == 1]
        assert odd, "no list of state_dict_metadata ends in a lone item"
        assert len(sm) > a.batch and len(sm) % a.batch == 1, \
            "storage_metadata does not end in a lone item (%d)" % len(sm)

    class P(pickle._Pickler):
        _BATCHSIZE = a.batch

    with open(a.path, "wb") as f:
        P(f, protocol=4).dump(m)
    print("ok", len(sdm), "keys", len(sm), "entries")


if __name__ == "__main__":
    main()
