#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Descriptor limits: a checkpoint holds one descriptor per data file, and
# torch 1.13 writes one file per item, so flexfs and flexfs-inspect raise
# RLIMIT_NOFILE's soft limit to the hard limit at start.

load helpers

PY=/usr/bin/python3
NFILES=1100 # more than the usual soft limit of 1024

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

@test "more data files than the soft limit (1,100 one-item files, soft limit 1024): inspect and mount read all" {
	(($(ulimit -Hn) > NFILES + 100)) ||
		skip "hard RLIMIT_NOFILE $(ulimit -Hn) is below $((NFILES + 100))"
	$PY -c 'import torch' 2>/dev/null || skip "no torch under $PY"
	require_fuse
	local out=$BATS_TEST_TMPDIR/many
	$PY "$FLEXFS_SRC/tests/bats/lib/gen_many_files.py" "$out" "$NFILES"
	[ "$(find "$out/ckpt" -name '*.distcp' | wc -l)" -eq "$NFILES" ]
	ulimit -Sn 1024
	run "$FLEXFS_INSPECT" "$out/ckpt"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"$NFILES tensors"* ]]
	mount_ff "$out/ckpt" "$MNT" "tp=1"
	grep -q "^Max open files  *$(ulimit -Hn) " "/proc/$FF_PID/limits"
	run $PY - "$MNT" "$out/truth.json" <<'PY'
import json, sys
import numpy as np
mnt, truth = sys.argv[1], json.load(open(sys.argv[2]))
for fqn, want in truth.items():
    got = np.load("%s/ranks/tp00_pp00/tensors/%s.npy" % (mnt, fqn))
    assert got.tolist() == want, fqn
st = open(mnt + "/ranks/tp00_pp00/model.safetensors", "rb").read()
print("ok", len(truth), len(st))
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok $NFILES "* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}
