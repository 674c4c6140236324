#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job on the bundled example: mount a TP2xPP2 torch DCP checkpoint
# resharded to TP4, list it, read a tensor through numpy, unmount.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FLEXFS_BIN:-build/fs/flexfs}
CKPT=examples/tiny-llama
MNT=$(mktemp -d /tmp/flexfs-demo.XXXXXX)
trap 'fusermount3 -u "$MNT" 2>/dev/null || true; rmdir "$MNT" 2>/dev/null || true' EXIT

echo "== flexfs $CKPT $MNT -o tp=4"
"$BIN" "$CKPT" "$MNT" -o tp=4
echo "== ls $MNT $MNT/ranks"
ls "$MNT" "$MNT/ranks"
echo "== ls -l $MNT/ranks/tp01_pp00 (head)"
ls -l "$MNT/ranks/tp01_pp00" | head -5
ls "$MNT/ranks/tp01_pp00/tensors" | head -5
echo "== numpy reads tp01's shard of layers.0.attention.wq.weight"
/usr/bin/python3 - "$MNT" <<'PY'
import json, sys, numpy as np
mnt = sys.argv[1]
a = np.load(f"{mnt}/ranks/tp01_pp00/tensors/layers.0.attention.wq.weight.npy", mmap_mode="r")
idx = json.load(open(f"{mnt}/index.json"))
t = idx["tensors"]["layers.0.attention.wq.weight"]
print("dtype", t["dtype"], "(bf16 bits as", a.dtype, ") global", t["shape"],
      "-> tp01 local", list(a.shape), "at offset", t["placement"]["tp01_pp00"]["offset"])
print("first row (as float32):", (a[0, :6].astype(np.uint32) << 16).view(np.float32))
PY
echo "== unmount"
fusermount3 -u "$MNT"
echo "demo: ok"
