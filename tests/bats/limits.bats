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

@test "absurd layouts: refused before the plan, in one line with the figure; pp past the layers + 2 stages refused" {
	local src=$FLEXFS_SRC/tests/fixtures/hf-tiny/single

	# before: 16 s and 3.3 GB building 4 M rank directories
	run bash -c "$(vm_limit 1048576)timeout 20 '$FLEXFS_INSPECT' '$src' -o tp=4096,pp=1024 2>&1 >/dev/null"
	echo "$output"
	[ "$status" -eq 1 ]
	[[ $output == *"tp: tp=4096 x pp=1024 over 44 tensors: 4194304 rank directories and 180224 tensor slices would take about 4.0 GiB of metadata, past the 2 GiB bound" ]]
	[ "${#lines[@]}" -eq 1 ]
	run timeout 20 "$FLEXFS_BIN" "$src" "$MNT" -f -o tp=4096,pp=1024
	[ "$status" -eq 1 ]
	[[ $output == *"past the 2 GiB bound" ]]
	not_mounted "$MNT"
	# 3 layers: 5 stages at most (the embedding's, the layers', the head's)
	run "$FLEXFS_INSPECT" "$src" -o pp=6
	echo "$output"
	[ "$status" -eq 1 ]
	[[ $output == *"pp: pp=6 but the checkpoint has 3 layer(s): at most 5 stages can hold a tensor" ]]
	run "$FLEXFS_INSPECT" "$src" -o tp=4096,pp=5
	[ "$status" -eq 0 ]
}
