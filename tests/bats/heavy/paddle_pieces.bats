#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Heavy (ctest -L heavy after -DFLEXFS_HEAVY_TESTS=ON; not in CI: about
# 1 GiB of disk per test and up to 6 GiB of memory for the writer): Paddle
# Flex Checkpoints saved by tools/fixtures/gen_paddle.py at Paddle's real
# threshold, (2**30 - 1) // itemsize elements, so that a uint8 [32770,
# 32768] tensor is saved in two pieces cut mid-row (docs/formats/paddle.md#arrays-saved-in-pieces:
# 1,073,741,823 + 65,537 elements).  The mount at tp 1 and 2 (rows split)
# and its hf/ view are read at sampled byte ranges (both sides of the cut,
# the ends, random places) and compared with the formula the writer filled
# the tensor with (numpy, nothing of flexfs).

load ../helpers

KEY=llama.embed_tokens.weight

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# write_ck DIR PROTOCOL MASK: the checkpoint, the tensor's bytes
# f(i) & MASK for flat index i (MASK 127: every byte below 0x80, which
# protocol 2's latin-1 text holds verbatim).
write_ck() {
	run /usr/bin/python3 - "$FLEXFS_SRC" "$1" "$KEY" "$2" "$3" <<'PY'
import sys
import numpy as np
sys.path[:0] = [sys.argv[1] + "/tools/fixtures"]
import gen_paddle as gp

out, key, proto, mask = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
shape = (32770, 32768)
i = np.arange(shape[0] * shape[1], dtype=np.uint64)
a = (((i * np.uint64(2654435761)) >> np.uint64(13)) & np.uint64(mask)).astype(np.uint8)
a = a.reshape(shape)
del i
small = np.arange(16, dtype="<f4").reshape(4, 4)
sd = {key: gp.SW(key, gp.Tensor(a, "embedding_0.w_0"), "uint8", (0, 0), shape, shape),
      "llama.norm.weight": gp.SW("llama.norm.weight", gp.Tensor(small, "norm_0.w_0"),
                                 "float32", (0, 0), (4, 4), (4, 4))}
del a
gp.save_state_dict([sd], out, 0, dict(gp.FLEX26, protocol=proto))
with open(out + "/0_0.distcp", "rb") as f:    # slice 1 and the info: the end
    f.seek(-(1 << 20), 2)
    tail = f.read()
assert gp.UNPACK_INFO.encode() in tail and (key + "@@.1").encode() in tail
assert (key + "@@.2").encode() not in tail
print("written, protocol", proto)
PY
	echo "$output"
	[ "$status" -eq 0 ]
}

# check_ck DIR MASK: mounted at tp 1 and 2, sampled ranges of ranks/ and
# hf/ equal the formula.
check_ck() {
	local tp

	# split along the rows at tp 2 (a single saved block is otherwise
	# replicated): rank 1 starts mid-tensor, past the cut
	echo '[{"match": "'"$KEY"'", "split": 0}]' >"$BATS_TEST_TMPDIR/rules.json"
	for tp in 1 2; do
		mount_ff "$1" "$MNT" "tp=$tp,rules=$BATS_TEST_TMPDIR/rules.json"
		run /usr/bin/python3 - "$MNT" "$KEY" "$tp" "$2" <<'PY'
import json, os, random, struct, sys
import numpy as np

mnt, key, tp, mask = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
W, H = 32768, 32770
CUT = 2 ** 30 - 1                      # the first slice's length


def want(start, n):
    i = np.arange(start, start + n, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) >> np.uint64(13)) & np.uint64(mask)) \
        .astype(np.uint8).tobytes()


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
            if f.read(n) != want(row0 * W + s, n):
                sys.exit(f"{path}: {name} differs at element {s} (global {row0 * W + s})")
    return len(spots)


n = 0
for r in range(tp):
    n += check(f"{mnt}/ranks/tp{r:02d}_pp00/model.safetensors", key, r * (H // tp))
for p in os.listdir(mnt + "/hf"):
    if p.endswith(".safetensors"):
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

@test "paddle protocol 3, real threshold: a uint8 tensor of 2**30 + 65536 elements saved in two pieces reads back at sampled ranges" {
	require_fuse
	write_ck "$BATS_TEST_TMPDIR/ck" 3 255
	check_ck "$BATS_TEST_TMPDIR/ck" 255
}

@test "paddle protocol 2, real threshold, every byte below 0x80 (latin-1 text verbatim, read in place): the pieces read back at sampled ranges" {
	require_fuse
	write_ck "$BATS_TEST_TMPDIR/ck" 2 127
	check_ck "$BATS_TEST_TMPDIR/ck" 127
}

@test "paddle protocol 2, real threshold, bytes from 0x80 up: the pieces would be decoded into more than 1 GiB at mount, refused in one line" {
	require_fuse
	write_ck "$BATS_TEST_TMPDIR/ck" 2 255
	mount_refused_line "$BATS_TEST_TMPDIR/ck" "" \
		"*0_0.distcp: $KEY@@.*: protocol-2 arrays (UTF-8 text of latin-1) need more than 1024 MiB decoded at mount; re-save with protocol 4 or 5*"
}
