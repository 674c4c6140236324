#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The Hugging Face safetensors source: tests/fixtures/hf-tiny (written by
# tools/fixtures/gen_hf.py, byte-identical to the real safetensors writer),
# one model.safetensors and the same tensors in three shards with
# model.safetensors.index.json, mounted at tp 1,2,4 x pp 1,2 with a rules
# file that splits the attention, MLP, embedding and head weights (the rest
# is saved whole and replicated).  Every byte of every view is checked
# against the original tensors by lib/check_views.py, and by the real
# safetensors library in the Debian trixie chroot when there is one.
# Malformed headers are refused at mount with one line.

load helpers

HF=$FLEXFS_SRC/tests/fixtures/hf-tiny
HF_RULES=$HF/rules.json
CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check_hf TREE TP PP [OPTS]: mount hf-tiny/TREE, check every view against
# the truth, unmount cleanly; the daemon said nothing.
check_hf() {
	local tree=$1 tp=$2 pp=$3 opts=${4:-}

	mount_ff "$HF/$tree" "$MNT" "tp=$tp,pp=$pp,rules=$HF_RULES${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$HF/truth" \
		--tp "$tp" --pp "$pp" --rules "$HF_RULES"
	echo "$tree tp=$tp pp=$pp: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

@test "hf single file: every view at tp 1,2,4 x pp 1,2 equals the original tensors" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_hf single "$tp" "$pp"
		done
	done
}

@test "hf sharded with index: every view at tp 1,2,4 x pp 1,2 equals the original tensors" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_hf sharded "$tp" "$pp"
		done
	done
}

@test "hf: index.json names the source; config and tokenizer pass through; whole tensors are replicated" {
	mount_ff "$HF/sharded" "$MNT" "tp=2,rules=$HF_RULES"
	run /usr/bin/python3 -c '
import json, sys
i = json.load(open(sys.argv[1] + "/index.json"))
s = i["source"]
assert s["format"] == "hf-safetensors", s
assert s["writer"] == "safetensors (format pt)", s
assert s["tensors"] == 44 and s["objects"] == 0 and s["files"] == 5, s
t = i["tensors"]
assert t["model.norm.weight"]["split_axis"] is None, t["model.norm.weight"]
assert t["lm_head.weight"]["split_axis"] == 0
print("ok")' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	cmp "$HF/sharded/config.json" "$MNT/hf/config.json"
	cmp "$HF/sharded/tokenizer.json" "$MNT/hf/tokenizer.json"
	# the source's own files are not passed through: hf/ has its own
	# (34 KB of tensors: one file, no index)
	[ "$(ls "$MNT/hf" | tr '\n' ' ')" = "config.json model.safetensors tokenizer.json " ]
	unmount_ff "$MNT"
}

@test "flexfs-inspect reads an HF directory" {
	run --separate-stderr "$FLEXFS_INSPECT" "$HF/single" -o "tp=4,rules=$HF_RULES"
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == TENSOR* ]]
	[[ $output == *"model.embed_tokens.weight"*"bfloat16"*"37x24"*"r0-2: 10x24, r3: 7x24"* ]]
	[[ $output == *"model.norm.weight"*"float64"*"r0-3: 24"* ]]
	run --separate-stderr "$FLEXFS_INSPECT" "$HF/sharded" --json -o "tp=2,pp=2,rules=$HF_RULES"
	[ "$status" -eq 0 ]
	[[ $output == *'"format": "hf-safetensors"'* || $output == *'"format":"hf-safetensors"'* ]]
}

# A copy of hf-tiny/single whose model.safetensors is given by a command.
broken_copy() {
	BROKEN=$BATS_TEST_TMPDIR/broken
	rm -rf "$BROKEN"
	cp -r "$HF/single" "$BROKEN"
}

mount_refused() {
	local word globs=("flexfs: $BROKEN/model.safetensors: *")

	for word in "$@"; do
		globs+=("*$word*")
	done
	mount_refused_line "$BROKEN" "tp=2,rules=$HF_RULES" "${globs[@]}"
}

@test "hf: malformed headers are refused at mount with one line naming the file" {
	broken_copy
	truncate -s 5 "$BROKEN/model.safetensors"
	mount_refused "header length"
	broken_copy
	printf '\xff\xff\xff\xff\x00\x00\x00\x00' | dd of="$BROKEN/model.safetensors" conv=notrunc status=none
	mount_refused "header length" "100000000"
	broken_copy
	truncate -s 20000 "$BROKEN/model.safetensors"
	mount_refused "run past the end of the file"
	broken_copy
	printf 'X' | dd of="$BROKEN/model.safetensors" bs=1 seek=8 conv=notrunc status=none
	mount_refused "header" "not valid JSON"
	broken_copy
	printf '\0\0\0\0' >>"$BROKEN/model.safetensors"
	mount_refused "trailing bytes: 4 after the last tensor's data"
}

@test "hf: an index naming a missing shard is refused with one line" {
	BROKEN=$BATS_TEST_TMPDIR/broken
	cp -r "$HF/sharded" "$BROKEN"
	rm "$BROKEN/model-00002-of-00003.safetensors"
	mount_refused_line "$BROKEN" "tp=2,rules=$HF_RULES" \
		"flexfs: $BROKEN/model-00002-of-00003.safetensors: *cannot open*"
}

# The real library (safetensors 0.4, torch 2.6) in the trixie chroot: it
# loads the fixture itself and every view of two mounts.
@test "real safetensors (trixie chroot) loads the fixture and the views" {
	local tree tp

	chroot_dir "$HF_RULES"
	cp -r "$HF/truth/." "$CHROOT$CHROOT_IN/truth/"
	cp -r "$HF/single" "$HF/sharded" "$CHROOT$CHROOT_IN/"
	run chroot "$CHROOT" python3 -c '
import json, sys, numpy as np, torch
from safetensors.torch import load_file
d = sys.argv[1]
m = json.load(open(d + "/truth/manifest.json"))["tensors"]
for tree in ("single", "sharded"):
    got = {}
    import glob
    for f in sorted(glob.glob(d + "/" + tree + "/*.safetensors")):
        got.update(load_file(f))
    assert sorted(got) == sorted(m), tree
    for n, e in m.items():
        raw = open(d + "/truth/" + e["file"], "rb").read()
        t = got[n]
        b = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        assert list(t.shape) == e["shape"] and str(t.dtype) == "torch." + e["dtype"], n
        assert b == raw, n
print("fixture ok")' "$CHROOT_IN"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"fixture ok"* ]]
	for tree in single sharded; do
		for tp in 1 4; do
			chroot_views "$HF/$tree" "$tp" 2 "rules=$HF_RULES" \
				--real-safetensors
		done
	done
}

# A directory two sources could read (a DCP checkpoint beside an HF
# model.safetensors): source_format= says which one; a source whose files
# are missing is refused with one line.
@test "source_format= picks the source of a directory both could read" {
	local both=$BATS_TEST_TMPDIR/both
	mkdir "$both"
	cp -r "$FLEXFS_SRC/tests/fixtures/dcp-t26/ckpt/." "$both/"
	cp "$HF/single/"* "$both/"
	mount_ff "$both" "$MNT" "tp=2,pp=2,rules=$HF_RULES,source_format=hf-safetensors"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$HF/truth" \
		--tp 2 --pp 2 --rules "$HF_RULES"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	grep -q '"format": "hf-safetensors"' "$MNT/index.json"
	# the DCP data files are the HF source's extras, passed through
	# verbatim (.metadata is hidden: never passed through)
	cmp "$both/__0_0.distcp" "$MNT/hf/__0_0.distcp"
	[ ! -e "$MNT/hf/.metadata" ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	run --separate-stderr "$FLEXFS_BIN" "$FLEXFS_SRC/tests/fixtures/dcp-t26/ckpt" \
		"$MNT" -o source_format=hf-safetensors 3>&-
	echo "status=$status stderr: $stderr" >&2
	[[ $status -ne 0 ]]
	[[ ${#stderr_lines[@]} -eq 1 ]]
	[[ ${stderr_lines[0]} == "flexfs: "*"/dcp-t26/ckpt/model.safetensors: cannot open"* ]]
	not_mounted "$MNT"
	run --separate-stderr "$FLEXFS_BIN" "$both" "$MNT" -o source_format=zarr 3>&-
	[[ $status -ne 0 ]]
	[[ ${stderr_lines[0]} == *"source_format"*"'zarr' is not a checkpoint format (megatron-torch_dist, megatron-zarr, torch-dcp, paddle-dcp, hf-safetensors, mindspore, "*"torch-save)" ]]
	not_mounted "$MNT"
}
