#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Heavy (ctest -L heavy after -DFLEXFS_HEAVY_TESTS=ON; not in CI: about
# 1 GiB of disk and 4 GiB of memory for the writer): a Paddle Flex
# Checkpoint saved with pickle protocol 3 by tools/fixtures/gen_paddle.py
# at Paddle's real threshold, (2**30 - 1) // itemsize elements, so that a
# uint8 [32770, 32768] tensor is saved in two pieces cut mid-row (spec 3.1
# item 2: 1,073,741,823 + 65,537 elements).  The mount at tp 1 and 2 and
# its hf/ view are read at sampled byte ranges (both sides of the cut, the
# ends, random places) and compared with the formula the writer filled the
# tensor with (numpy, nothing of flexfs).

load ../helpers

KEY=llama.embed_tokens.weight

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

@test "paddle protocol 3, real threshold: a uint8 tensor of 2**30 + 65536 elements saved in two pieces reads back at sampled ranges" {
	require_fuse
	local ck=$BATS_TEST_TMPDIR/ck

	run /usr/bin/python3 - "$FLEXFS_SRC" "$ck" "$KEY" <<'PY'
import sys
import numpy as np
sys.path[:0] = [sys.argv[1] + "/tools/fixtures"]
import gen_paddle as gp

out, key = sys.argv[2], sys.argv[3]
shape = (32770, 32768)
i = np.arange(shape[0] * shape[1], dtype=np.uint64)
a = ((i * np.uint64(2654435761)) >> np.uint64(13)).astype(np.uint8).reshape(shape)
del i
small = np.arange(16, dtype="<f4").reshape(4, 4)
sd = {key: gp.SW(key, gp.Tensor(a, "embedding_0.w_0"), "uint8", (0, 0), shape, shape),
      "llama.norm.weight": gp.SW("llama.norm.weight", gp.Tensor(small, "norm_0.w_0"),
                                 "float32", (0, 0), (4, 4), (4, 4))}
gp.save_state_dict([sd], out, 0, dict(gp.FLEX26, protocol=3))
with open(out + "/0_0.distcp", "rb") as f:    # slice 1 and the info: the last 64 KiB
    f.seek(-(1 << 20), 2)
    tail = f.read()
assert gp.UNPACK_INFO.encode() in tail and (key + "@@.1").encode() in tail
assert (key + "@@.2").encode() not in tail
print("written")
PY
	echo "$output"
	[ "$status" -eq 0 ]
	# split along the rows at tp 2 (a single saved block is otherwise
	# replicated): rank 1 starts mid-tensor, past the cut
	echo '[{"match": "'"$KEY"'", "split": 0}]' >"$BATS_TEST_TMPDIR/rules.json"
	local tp
	for tp in 1 2; do
		mount_ff "$ck" "$MNT" "tp=$tp,rules=$BATS_TEST_TMPDIR/rules.json"
		run /usr/bin/python3 - "$MNT" "$KEY" "$tp" <<'PY'
import json, os, random, struct, sys
import numpy as np

mnt, key, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
W, H = 32768, 32770
CUT = 2 ** 30 - 1                      # the first slice's length


def want(start, n):
    i = np.arange(start, start + n, dtype=np.uint64)
    return ((i * np.uint64(2654435761)) >> np.uint64(13)).astype(np.uint8).tobytes()


def tensor(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    e = h[name]
    assert e["dtype"] == "U8", e
    return 8 + n + e["data_offsets"][0], e["shape"]


def check(path, name, row0):
    at, shape = tensor(path, name)
    rows = shape[0]
    assert shape[1] == W and rows == (H if "/hf/" in path else H // tp), shape
    total = rows * W
    rnd = random.Random(7)
    spots = [0, total - 4096]
    c = CUT - row0 * W                 # the cut, local to this file
    if 0 <= c < total:
        spots += [max(0, c - 2048), c - 1, c, max(0, c - W)]
    spots += [rnd.randrange(0, total - 4096) for _ in range(48)]
    with open(path, "rb") as f:
        for s in spots:
            n = min(4096, total - s)
            f.seek(at + s)
            got = f.read(n)
            if got != want(row0 * W + s, n):
                sys.exit(f"{path}: {name} differs at element {s} (global {row0 * W + s})")
    return len(spots)


n = 0
for r in range(tp):
    n += check(f"{mnt}/ranks/tp{r:02d}_pp00/model.safetensors" if tp > 1
               else f"{mnt}/ranks/tp00_pp00/model.safetensors", key, r * (H // tp))
hf = [p for p in os.listdir(mnt + "/hf") if p.endswith(".safetensors")]
for p in hf:
    with open(f"{mnt}/hf/{p}", "rb") as f:
        hn = struct.unpack("<Q", f.read(8))[0]
        if key in json.loads(f.read(hn)):
            n += check(f"{mnt}/hf/{p}", key, 0)
print(f"tp={tp}: {n} ranges equal the formula")
PY
		echo "$output"
		[ "$status" -eq 0 ]
		unmount_ff "$MNT"
	done
}
