#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# A backing file truncated, rewritten or replaced after mount: the views
# that read it fail (EIO on read, ESTALE on open) instead of returning
# wrong or mixed bytes; the daemon logs each failing file once and keeps
# serving every other file.

load helpers

PY=/usr/bin/python3

setup() {
	setup_ff
	CK=$BATS_TEST_TMPDIR/ckpt
	cp -a "$FLEXFS_SRC/tests/fixtures/dcp-t113/ckpt" "$CK"
	# torch 1.13 writes one file per item: find the item of one chunk of
	# wq of layer 0, and a file that tensor does not use
	mount_ff "$CK" "$MNT" "tp=1,rules=$RULES"
	WQ_FILE=$($PY - "$MNT/index.json" <<'PY'
import json, sys
idx = json.load(open(sys.argv[1]))
print(idx["objects"]["extra.step"]["file"])
PY
)
}

teardown() {
	teardown_ff
}

# read FILE -> prints "ok <bytes>" or the errno name
read_file() {
	$PY - "$1" <<'PY'
import errno, os, sys
try:
    with open(sys.argv[1], "rb") as f:
        print("ok", len(f.read()))
except OSError as e:
    print(errno.errorcode[e.errno])
PY
}

@test "truncated after mount: EIO on an open file, ESTALE on open, logged once" {
	obj=$MNT/objects/extra.step.pt
	# opened before the change: the read fails
	run $PY - "$obj" "$CK/$WQ_FILE" <<'PY'
import errno, os, sys
f = open(sys.argv[1], "rb", buffering=0)
os.truncate(sys.argv[2], 10)
for _ in range(3):
    try:
        f.read()
        print("read ok")
    except OSError as e:
        print(errno.errorcode[e.errno])
PY
	[ "$output" = "$(printf 'EIO\nEIO\nEIO')" ]
	# opened after it: the open fails
	run read_file "$obj"
	[ "$output" = ESTALE ]
	run read_file "$MNT/hf/config.json"
	[[ $output == "ok "* ]]
	run read_file "$MNT/ranks/tp00_pp00/tensors/layers.0.attention.wq.weight.npy"
	[[ $output == "ok "* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	# one line for the failing file, however often it failed, naming
	# the backing file and what changed
	[ "$(grep -c 'objects/extra.step.pt' "$FF_ERR")" -eq 1 ]
	[ "$(wc -l <"$FF_ERR")" -eq 1 ]
	grep -Eq "objects/extra.step.pt: read failed: Input/output error \($WQ_FILE: [0-9]+ bytes at mount, 10 now\)$" "$FF_ERR"
}

@test "daemonized with -o log=FILE (relative): each failing file's one line, with the backing file and reason, lands in FILE" {
	local log=$BATS_TEST_TMPDIR/logs/flexfs.log
	unmount_ff "$MNT"
	mkdir "$BATS_TEST_TMPDIR/logs"
	# a log that cannot be opened fails the mount, on stderr
	run "$FLEXFS_BIN" "$CK" "$MNT" -o "tp=1,rules=$RULES,log=$BATS_TEST_TMPDIR/none/x.log" 3>&-
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == "flexfs: $BATS_TEST_TMPDIR/none/x.log: log: cannot open: No such file or directory" ]]
	not_mounted "$MNT"
	# no -f: the daemon detaches, its stderr is gone
	(cd "$BATS_TEST_TMPDIR/logs" && "$FLEXFS_BIN" "$CK" "$MNT" -o "tp=1,rules=$RULES,log=flexfs.log" 3>&-)
	mountpoint -q "$MNT"
	rm "$CK/config.json"
	run read_file "$MNT/hf/config.json"
	[ "$output" = ESTALE ]
	run read_file "$MNT/hf/config.json"
	[ "$output" = ESTALE ]
	truncate -s 10 "$CK/$WQ_FILE"
	run read_file "$MNT/objects/extra.step.pt"
	[ "$output" = ESTALE ]
	run read_file "$MNT/index.json"
	[[ $output == "ok "* ]]
	fusermount3 -u "$MNT"
	cat "$log"
	[ "$(wc -l <"$log")" -eq 2 ]
	grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z flexfs\[[0-9]+\]: hf/config.json: open failed: Stale file handle \(config.json: removed or replaced since mount\)$' "$log"
	grep -Eq "flexfs\[[0-9]+\]: objects/extra.step.pt: open failed: Stale file handle \($WQ_FILE: [0-9]+ bytes at mount, 10 now\)$" "$log"
}

@test "rewritten in place (same size, new mtime): EIO, never mixed bytes" {
	obj=$MNT/objects/extra.step.pt
	size=$(stat -c %s "$CK/$WQ_FILE")
	head -c "$size" /dev/zero >"$CK/$WQ_FILE.new"
	dd if="$CK/$WQ_FILE.new" of="$CK/$WQ_FILE" conv=notrunc status=none
	touch -d '+1 minute' "$CK/$WQ_FILE"
	run read_file "$obj"
	[ "$output" = EIO ] || [ "$output" = ESTALE ]
	run read_file "$MNT/hf/tokenizer.json"
	[[ $output == "ok "* ]]
}

# rewrite_keep_times FILE: zeros over every byte, in place (same inode,
# same size), then the mtime put back to the nanosecond: only ctime tells.
rewrite_keep_times() {
	local m size
	m=$(stat -c %y "$1")
	size=$(stat -c %s "$1")
	head -c "$size" /dev/zero | dd of="$1" conv=notrunc status=none
	touch -d "$m" "$1"
	[ "$(stat -c %y "$1")" = "$m" ]
}

# read_after_rewrite OBJ FILE: open OBJ (not read yet), rewrite FILE with
# its mtime kept, then read OBJ three times through the open descriptor;
# one line each, "read ok" or the errno name; then a fresh open's outcome.
read_after_rewrite() {
	$PY - "$1" "$2" <<'PY'
import errno, os, subprocess, sys
f = open(sys.argv[1], "rb", buffering=0)
subprocess.run(["bash", "-c", 'source "$0"; rewrite_keep_times "$1"',
                os.environ["REWRITE_LIB"], sys.argv[2]], check=True)
for _ in range(3):
    try:
        f.seek(0)
        f.read()
        print("read ok")
    except OSError as e:
        print(errno.errorcode[e.errno])
try:
    open(sys.argv[1], "rb").read()
    print("open ok")
except OSError as e:
    print(errno.errorcode[e.errno])
PY
}

@test "rewritten in place with its mtime put back: EIO on every read, page cache and direct_io" {
	export REWRITE_LIB=$BATS_TEST_TMPDIR/rewrite.bash
	declare -f rewrite_keep_times >"$REWRITE_LIB"
	obj=$MNT/objects/extra.step.pt
	npy=$MNT/ranks/tp00_pp00/tensors/layers.0.attention.wq.weight.npy
	# the page cache (the mount of setup())
	run read_after_rewrite "$obj" "$CK/$WQ_FILE"
	echo "$output"
	[ "$output" = "$(printf 'EIO\nEIO\nEIO\nESTALE')" ]
	run read_file "$npy"
	[[ $output == "ok "* ]]
	unmount_ff "$MNT"
	# direct_io, over a fresh copy
	rm -rf "$CK"
	cp -a "$FLEXFS_SRC/tests/fixtures/dcp-t113/ckpt" "$CK"
	mount_ff "$CK" "$MNT" "tp=1,rules=$RULES,direct_io"
	run read_after_rewrite "$obj" "$CK/$WQ_FILE"
	echo "$output"
	[ "$output" = "$(printf 'EIO\nEIO\nEIO\nESTALE')" ]
	run read_file "$npy"
	[[ $output == "ok "* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	# one line for the failing file, however often it failed
	[ "$(grep -c 'objects/extra.step.pt' "$FF_ERR")" -eq 1 ]
}

@test "replaced by rename after mount: ESTALE on open" {
	obj=$MNT/objects/extra.step.pt
	cp "$CK/$WQ_FILE" "$CK/$WQ_FILE.tmp"
	mv "$CK/$WQ_FILE.tmp" "$CK/$WQ_FILE"
	run read_file "$obj"
	[ "$output" = ESTALE ]
	run read_file "$MNT/index.json"
	[[ $output == "ok "* ]]
}

@test "a passthrough file removed after mount: ESTALE, the rest still served" {
	rm "$CK/config.json"
	run read_file "$MNT/hf/config.json"
	[ "$output" = ESTALE ]
	run read_file "$MNT/hf/tokenizer.json"
	[[ $output == "ok "* ]]
}

# A file cut short after the daemon checked it and before it spliced the
# bytes (the shim makes pread/splice of it stop at 256 KiB while fstat
# still reports 1 MiB): libfuse would send the bytes it got as a short
# reply, which the kernel takes for the end of the file.  The reader must
# get EIO instead of a shorter file, with the page cache and direct_io.
@test "cut short during a spliced reply: EIO, not a shorter file" {
	[[ -f ${FLEXFS_SHORT_READ:-} ]] || skip "no short-read shim (run through ctest)"
	local big=$CK/weights.bin opts
	unmount_ff "$MNT"
	head -c 1048576 /dev/urandom >"$big"
	for opts in "tp=1,rules=$RULES" "tp=1,rules=$RULES,direct_io"; do
		LD_PRELOAD=$FLEXFS_SHORT_READ FLX_SHORT_FILE=$big FLX_SHORT_AT=262144 \
			ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
			mount_ff "$CK" "$MNT" "$opts"
		[[ $(stat -c %s "$MNT/hf/weights.bin") == 1048576 ]]
		run read_file "$MNT/hf/weights.bin"
		echo "$opts: $output"
		[ "$output" = EIO ]
		[[ $(stat -c %s "$MNT/hf/weights.bin") == 1048576 ]]
		# the other files are served as before
		run read_file "$MNT/hf/config.json"
		[[ $output == "ok "* ]]
		unmount_ff "$MNT"
		grep -q 'hf/weights.bin: read failed: Input/output error (a backing file ended early while the reply was sent: changed under the mount)' "$FF_ERR"
	done
}

# A rank file of many small tensors (gen_scale.py: 1,024 float32 [1, 256]
# tensors, each its own torch.save item in one __0_0.distcp): a request
# holds hundreds of backing ranges, more than a spliced reply takes, and
# is replied from the mapped backing file.
small_items() {
	SMALL=$BATS_TEST_TMPDIR/small
	$PY "$FLEXFS_SRC/tools/bench/gen_scale.py" --out "$SMALL" --tensors 1024 \
		--ranks 1 --cols 256 --items real >/dev/null
}

# every tensor of the rank file: layers.T.w holds T * 256 + [0, 256)
check_small() {
	$PY - "$1" <<'PY'
import json, struct, sys
import numpy as np
with open(sys.argv[1], "rb") as f:
    raw = f.read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
hdr.pop("__metadata__", None)
assert sorted(hdr) == sorted("layers.%d.w" % t for t in range(1024))
for name, e in hdr.items():
    a, b = e["data_offsets"]
    t = int(name.split(".")[1])
    want = np.arange(t * 256, t * 256 + 256, dtype="<f4")
    assert e["dtype"] == "F32" and e["shape"] == [1, 256], name
    assert raw[8 + n + a:8 + n + b] == want.tobytes(), name
print("ok")
PY
}

@test "many small tensors: replied from the mapped backing file, every byte right" {
	small_items
	unmount_ff "$MNT"
	FLEXFS_FUSE_STATS=1 mount_ff "$SMALL" "$MNT" "tp=1"
	run check_small "$MNT/ranks/tp00_pp00/model.safetensors"
	echo "$output"
	[ "$output" = ok ]
	unmount_ff "$MNT"
	line=$(grep '^flexfs: fuse stats: ' "$FF_ERR")
	echo "$line"
	[[ $line =~ \ mapped\ ([0-9]+)$ ]]
	((BASH_REMATCH[1] > 0))
}

# The same file cut short after the daemon checked it and before the
# kernel copied a reply from its mapping (the shim maps a copy of the
# bytes before the cut): EIO, never a shorter file nor zeros.
@test "cut short during a reply from the mapped backing file: EIO, not a shorter file" {
	[[ -f ${FLEXFS_SHORT_READ:-} ]] || skip "no short-read shim (run through ctest)"
	local armed=$BATS_TEST_TMPDIR/armed opts size
	small_items
	unmount_ff "$MNT"
	for opts in "tp=1" "tp=1,direct_io"; do
		rm -f "$armed"
		FLEXFS_FUSE_STATS=1 LD_PRELOAD=$FLEXFS_SHORT_READ \
			FLX_SHORT_FILE=$SMALL/__0_0.distcp FLX_SHORT_AT=1048576 \
			FLX_SHORT_ARMED=$armed \
			ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
			mount_ff "$SMALL" "$MNT" "$opts"
		size=$(stat -c %s "$MNT/ranks/tp00_pp00/model.safetensors")
		touch "$armed"
		run read_file "$MNT/ranks/tp00_pp00/model.safetensors"
		echo "$opts: $output"
		[ "$output" = EIO ]
		[[ $(stat -c %s "$MNT/ranks/tp00_pp00/model.safetensors") == "$size" ]]
		unmount_ff "$MNT"
		grep -q 'model.safetensors: read failed: Input/output error (a backing file ended early while the reply was sent: changed under the mount)' "$FF_ERR"
		[[ $(grep '^flexfs: fuse stats: ' "$FF_ERR") =~ \ mapped\ [1-9][0-9]*$ ]]
	done
}
