#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The Paddle Flex Checkpoint source: the tests/fixtures/paddle-* fixtures
# (tools/fixtures/gen_paddle.py, a stand-in writer exact to the spec: both
# metadata module paths, protocols 4 and 5, numpy 1.x and 2.x names, bf16
# as uint16 bits, float8, a dtype zoo, uneven splits, TP x sharding stage 1
# v2 with flattened optimizer shards cut mid-row, save_replicas), each
# mounted at tp 1, 2, 4 x pp 1, 2 and every byte of every generic view
# (index.json, ranks/*/model.safetensors, npy, hf/) checked by
# lib/check_views.py against the truth lib/paddle_truth.py takes from the
# fixture.  Several ids in one directory: the highest, or -o paddle_id=N;
# ids 0 and 1 there are protocol 2 (bytes as UTF-8 text of latin-1,
# decoded at mount).

load helpers

FX=$FLEXFS_SRC/tests/fixtures
TRUTH=$FLEXFS_SRC/tests/bats/lib/paddle_truth.py

setup() {
	setup_ff
	views_setup
}

teardown() {
	views_teardown
	teardown_ff
}

# pd_mount NAME DIR TRUTH_ARGS OPTS TPxPP...: mount DIR once per TPxPP
# (OPTS added), each to be checked by views_check against the truth of
# fixture NAME (lib/paddle_truth.py with TRUTH_ARGS).
pd_mount() {
	local fx=$1 dir=$2 targs=$3 opts=$4
	local truth=$BATS_TEST_TMPDIR/truth-$fx${targs// /}

	shift 4
	# shellcheck disable=SC2086
	[ -d "$truth" ] || /usr/bin/python3 "$TRUTH" "$FX/$fx" "$truth" $targs
	views_add "$dir" "$truth" "$opts" "$@"
}

ALL="1x1 1x2 2x1 2x2 4x1 4x2"

@test "paddle flex p4, p5 and sharding v2 (flattened shards cut mid-row, replicas): every view at tp 1,2,4 x pp 1,2 equals the truth" {
	local fx

	for fx in paddle-flex-p4 paddle-flex-p5 paddle-flex-np2-sharding; do
		# shellcheck disable=SC2086
		pd_mount "$fx" "$FX/$fx/ckpt" "" "" $ALL
	done
	views_check
}

@test "paddle PaddleFormers checkpoint-N and its parts, several ids (the highest by default, paddle_id=N): every view equals the truth" {
	local d=$FX/paddle-formers-np2-p4/ckpt/checkpoint-5 m=$FX/paddle-multi-id/ckpt

	pd_mount paddle-formers-np2-p4 "$d/model_state" "--part model_state" "" \
		1x1 2x1 4x1
	pd_mount paddle-formers-np2-p4 "$d/optimizer_state" \
		"--part optimizer_state" "" 1x2 2x2 4x2
	pd_mount paddle-formers-np2-p4 "$d" \
		"--part model_state --part optimizer_state" "" 2x1 4x2
	pd_mount paddle-formers-master-p3 \
		"$FX/paddle-formers-master-p3/ckpt/checkpoint-5" \
		"--part model_state --part optimizer_state --part master_weight" \
		"" 1x1 2x1
	pd_mount paddle-multi-id "$m" "" "" 2x1
	pd_mount paddle-multi-id "$m" "--id 0" paddle_id=0 1x1 2x2
	pd_mount paddle-multi-id "$m" "--id 1" paddle_id=1 2x1
	pd_mount paddle-multi-id "$m" "--id 3" paddle_id=3 1x1 2x1
	pd_mount paddle-multi-id "$m" "--id 10" paddle_id=10 2x2
	views_check
	mount_ff "$m" "$MNT" "paddle_id=10"
	run /usr/bin/python3 - "$MNT/index.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["source"]["format"] == "paddle-dcp", d["source"]
assert d["source"]["writer"].startswith("Paddle Flex Checkpoint"), d["source"]
assert "id 10" in d["source"]["writer"], d["source"]
print("ok")
EOF
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
}

@test "paddle arrays saved in pieces (UnpackBigParamInfor@@: protocol 2 latin-1 text, protocol 3 bytes; cuts mid-row and inside flattened shards): every view at tp 1,2,4 equals numpy's concatenation of the slices" {
	local fx=$FX/paddle-flex-pieces

	# the truth is the oracle's: gen_paddle.py check rebuilds every tensor
	# from the files by an opcode walk with np.concatenate(slices).reshape(
	# OriginShape) and by pickle.load, and compares it with truth/
	run /usr/bin/python3 "$FLEXFS_SRC/tools/fixtures/gen_paddle.py" check "$fx"
	echo "$output"
	[ "$status" -eq 0 ]
	pd_mount paddle-flex-pieces "$fx/ckpt" "" "" 1x1 2x1 4x2
	pd_mount paddle-flex-pieces "$fx/ckpt" "--id 0" paddle_id=0 1x1 2x1 4x1
	views_check
}

@test "paddle arrays saved in pieces re-cut anywhere (uneven and empty slices, other names, the info first, slices in reverse): every view equals the truth" {
	local d=$BATS_TEST_TMPDIR/recut

	# paddle.load only concatenates the listed slices: their lengths,
	# names and places in the dict are not the reader's business
	cp -r "$FX/paddle-flex-pieces/ckpt" "$d"
	run /usr/bin/python3 - "$d" <<'PY'
import glob, pickle, random, sys
import numpy as np
INFO = "UnpackBigParamInfor@@"
rnd = random.Random(5)
n = 0
for f in sorted(glob.glob(sys.argv[1] + "/*_1.distcp")):
    with open(f, "rb") as h:
        d = pickle.load(h)
    info, new, parts = d.pop(INFO), {}, {}
    for k, v in info.items():
        flat = np.concatenate([d.pop(s) for s in v["slices"]])
        cuts = sorted(rnd.randrange(0, flat.size + 1) for _ in range(3))
        cuts = [0] + cuts[:1] * 2 + cuts[1:] + [flat.size]   # one empty slice
        names = [f"{k}/piece-{chr(97 + j)}" for j in range(len(cuts) - 1)]
        for j, nm in enumerate(names):
            parts[nm] = flat[cuts[j]:cuts[j + 1]]
        new[k] = {"slices": names, "OriginShape": list(v["OriginShape"])}
        want = flat.reshape(v["OriginShape"])
        got = np.concatenate([parts[x] for x in names]).reshape(new[k]["OriginShape"])
        assert got.tobytes() == want.tobytes()
        n += 1
    out = {INFO: new}
    out.update(reversed(list(parts.items())))
    out.update(d)
    with open(f, "wb") as h:
        pickle.dump(out, h, protocol=3)
print("ok", n, "arrays re-cut")
PY
	echo "$output"
	[ "$status" -eq 0 ]
	pd_mount paddle-flex-pieces "$d" "" "" 1x1 2x1
	views_check
}

@test "paddle metadata re-pickled in batches of 2 (streamed batch by batch) and of 3 (lists and storage_metadata ending in a lone item: decoded as a tree): every view equals the truth" {
	local rb=$FLEXFS_SRC/tests/bats/lib/paddle_rebatch.py
	local d2=$BATS_TEST_TMPDIR/batch2 d3=$BATS_TEST_TMPDIR/batch3

	# the loader streams state_dict_metadata's lists and storage_metadata's
	# pairs as APPENDS/SETITEMS batches; an item added alone after them
	# stays in the tree, and the whole metadata is decoded again as one
	cp -r "$FX/paddle-flex-p4/ckpt" "$d2"
	cp -r "$FX/paddle-flex-np2-sharding/ckpt" "$d3"
	run /usr/bin/python3 "$rb" "$d2/0.metadata" 2
	echo "$output"
	[ "$status" -eq 0 ]
	run /usr/bin/python3 "$rb" "$d3/0.metadata" 3 --require-tails
	echo "$output"
	[ "$status" -eq 0 ]
	pd_mount paddle-flex-p4 "$d2" "" "" 1x1 2x2
	pd_mount paddle-flex-np2-sharding "$d3" "" "" 1x1 2x1 4x2
	views_check
}

@test "paddle: an LTM or a storage entry the stream cannot take is refused as the tree decode words it (naming the key)" {
	local rb=$FLEXFS_SRC/tests/bats/lib/paddle_rebatch.py
	local d=$BATS_TEST_TMPDIR/bad k=llama.embed_tokens.weight

	cp -r "$FX/paddle-flex-p4/ckpt" "$d"
	run /usr/bin/python3 "$rb" "$d/0.metadata" 1000 --dtype "$k" paddle.foo
	[ "$status" -eq 0 ]
	mount_refused_line "$d" "" \
		"*/0.metadata: $k: unsupported dtype 'paddle.foo'"
	cp "$FX/paddle-flex-p4/ckpt/0.metadata" "$d/0.metadata"
	run /usr/bin/python3 "$rb" "$d/0.metadata" 1000 --replica "$k" -1
	[ "$status" -eq 0 ]
	mount_refused_line "$d" "" \
		"*/0.metadata: $k: replica_id is not a non-negative integer"
}

@test "paddle: refused at mount in one line: a missing id, no checkpoint" {
	mount_refused_line "$FX/paddle-multi-id/ckpt" "paddle_id=5" \
		"*5.metadata: paddle_id: no such file (the highest id here is 10)*"
	mkdir "$BATS_TEST_TMPDIR/empty"
	mount_refused_line "$BATS_TEST_TMPDIR/empty" "" \
		"*no <id>.metadata (Paddle Flex Checkpoint)*" \
		"*no metadata.json (Megatron-Core)*" \
		"*(Hugging Face safetensors)*" "*(MindSpore)*"
}

@test "paddle: -o source_format=paddle-dcp on a DCP checkpoint names the missing file; a PaddleFormers output directory names its checkpoint-N/" {
	mount_refused_line "$FX/fsdp2/ckpt" "source_format=paddle-dcp" \
		"*/fsdp2/ckpt/<id>.metadata: no such file, nor model_state/ (is this a Paddle Flex Checkpoint directory?)"
	run --separate-stderr "$FLEXFS_INSPECT" "$FX/fsdp2/ckpt" -o source_format=paddle-dcp
	[ "$status" -ne 0 ]
	[[ $stderr == *"<id>.metadata: no such file"* && $stderr != *"building file"* ]]
	# the directory PaddleFormers' Trainer writes checkpoint-5/ into
	mount_refused_line "$FX/paddle-formers-np2-p4/ckpt" "" \
		"*/paddle-formers-np2-p4/ckpt: a training output directory, not a checkpoint: it holds 1 checkpoint-<step>/ directory; mount one of them (the latest: checkpoint-5)"
	local d=$BATS_TEST_TMPDIR/out
	mkdir -p "$d/checkpoint-20" "$d/checkpoint-300" "$d/checkpoint-x" "$d/runs"
	ln -s /nonexistent "$d/checkpoint-9000"
	mount_refused_line "$d" "" "*it holds 2 checkpoint-<step>/ directories; mount one of them (the latest: checkpoint-300)"
	run "$FLEXFS_INSPECT" "$FX/paddle-formers-np2-p4/ckpt/checkpoint-5"
	[ "$status" -eq 0 ]
}

@test "paddle protocol 5 with read-only arrays (_frombuffer over SHORT_BINBYTES/BINBYTES instead of BYTEARRAY8): every view equals the truth" {
	local d=$BATS_TEST_TMPDIR/readonly

	# pickle writes a read-only buffer as bytes (docs/formats/paddle.md#numpy-arrays-in-pickles: "_frombuffer +
	# BYTEARRAY8/BINBYTES8"); p5's files re-saved so, name table last
	cp -r "$FX/paddle-flex-p5/ckpt" "$d"
	run /usr/bin/python3 - "$d" <<'PY'
import collections, glob, pickle, pickletools, sys
import numpy as np
ops = collections.Counter()
for f in sorted(glob.glob(sys.argv[1] + "/*.distcp")):
    with open(f, "rb") as h:
        d = pickle.load(h)
    for v in d.values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    b = pickle.dumps(d, protocol=5)
    ops.update(op.name for op, _, _ in pickletools.genops(b))
    with open(f, "wb") as h:
        h.write(b)
assert list(d)[-1] == "StructuredToParameterName@@"
assert ops["BYTEARRAY8"] == 0 and ops["SHORT_BINBYTES"] and ops["BINBYTES"], ops
print("ok")
PY
	echo "$output"
	[ "$status" -eq 0 ]
	pd_mount paddle-flex-p5 "$d" "" "" 1x1 2x2
	views_check
}
