#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# More data files than descriptors (#17 item 5): torch 1.13's default layout
# writes one file per item; a checkpoint of FLEXFS_MANY_FILES (default 2,000)
# of them, written here by torch's own save_state_dict
# (lib/gen_many_items.py), mounts and reads under ulimit -n 256: the files
# past the budget are opened on use through the fd table, identity checked.
# The 100,000-file variant: FLEXFS_MANY_FILES=100000 (ctest -L slow, with
# -DFLEXFS_SLOW_TESTS=ON).

load helpers

PY=/usr/bin/python3
GEN=$FLEXFS_SRC/tests/bats/lib/gen_many_items.py

# written once for the file's tests (the second one changes it: last)
setup_file() {
	export N=${FLEXFS_MANY_FILES:-2000}
	export CK=$BATS_FILE_TMPDIR/many
	if "$PY" -c 'import torch, numpy' 2>/dev/null; then
		"$PY" "$GEN" "$CK" "$N" 2>/dev/null
	fi
}

setup() {
	setup_ff
	require_fuse
	[[ -f $CK/.metadata ]] ||
		skip "torch 1.13 and numpy under /usr/bin/python3 are needed to write the checkpoint"
}

teardown() {
	teardown_ff
}

# check_all MNT N: every tensor w.%06d, through the tp=1 safetensors file
# (one file: every item file read by a few large requests) and through its
# own .npy (N files, read by 8 processes at once), equals arange(4i, 4i+4).
check_all() {
	"$PY" - "$1" "$2" <<-'EOF'
		import json, os, struct, sys
		from concurrent.futures import ThreadPoolExecutor
		import numpy as np
		mnt, n = sys.argv[1], int(sys.argv[2])
		rank = os.path.join(mnt, "ranks", "tp00_pp00")
		with open(os.path.join(rank, "model.safetensors"), "rb") as f:
		    data = f.read()
		hlen = struct.unpack("<Q", data[:8])[0]
		head = json.loads(data[8:8 + hlen])
		body = data[8 + hlen:]
		names = sorted(k for k in head if k != "__metadata__")
		assert names == ["w.%06d" % i for i in range(n)], (len(names), n)
		for k in names:
		    i = int(k[2:])
		    e = head[k]
		    assert e["dtype"] == "F32" and e["shape"] == [4], (k, e)
		    a, b = e["data_offsets"]
		    got = np.frombuffer(body[a:b], "<f4")
		    assert (got == np.arange(4 * i, 4 * i + 4)).all(), (k, got)
		def npy(i):
		    got = np.load(os.path.join(rank, "tensors", "w.%06d.npy" % i))
		    return bool((got == np.arange(4 * i, 4 * i + 4)).all())
		with ThreadPoolExecutor(8) as ex:
		    bad = [i for i, ok in enumerate(ex.map(npy, range(n))) if not ok]
		assert not bad, bad[:10]
		print("checked", n)
	EOF
}

@test "a checkpoint of one file per item, more files than ulimit -n allows, mounts and reads exactly" {
	[ "$(find "$CK" -name '*.distcp' | wc -l)" -eq "$N" ]
	ulimit -n 256 # soft and hard: the daemon cannot raise it
	# direct_io: the second pass reaches the daemon again
	mount_ff "$CK" "$MNT" "tp=1,direct_io"
	[ "$(awk '/Max open files/ { print $4 }' "/proc/$FF_PID/limits")" -eq 256 ]
	run check_all "$MNT" "$N"
	echo "$output"
	[ "$status" -eq 0 ]
	# again: the descriptors were recycled, not leaked
	run check_all "$MNT" "$N"
	[ "$status" -eq 0 ]
	[ "$(ls "/proc/$FF_PID/fd" | wc -l)" -le 256 ]
}

@test "past the budget too, a file rewritten in place (mtime put back) is EIO, the others still read" {
	ulimit -n 256
	mount_ff "$CK" "$MNT" "tp=1"
	# every item file is touched: whether a file kept its descriptor or
	# is opened on use, its ctime moved
	find "$CK" -name '*.distcp' -exec touch -r "$CK/.metadata" {} +
	run cat "$MNT/ranks/tp00_pp00/tensors/w.000000.npy"
	[ "$status" -ne 0 ]
	run cat "$MNT/ranks/tp00_pp00/tensors/w.$(printf %06d $((N - 1))).npy"
	[ "$status" -ne 0 ]
	[[ $output == *"Input/output error"* || $output == *"Stale file handle"* ]]
	# the generated parts still read
	cat "$MNT/index.json" >/dev/null
}
