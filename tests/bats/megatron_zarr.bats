#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The Megatron-Core zarr backend (docs/formats/megatron.md#zarr-backend), format
# megatron-zarr: tests/fixtures/megatron-zarr (megatron-untied's model,
# bf16, written by tools/fixtures/gen_megatron.py zarr) and two checkpoints
# the same writer makes here from other fixtures: megatron-moe-fp8 with the
# older with_suffix object names (the docs/formats/megatron.md#key-namespaces key variant) and its
# common.pt byte for byte, and the fully_sharded_model_space optimizer
# fixture, whose zarr arrays hold the optimizer state at the model's
# shape.  Oracles: the numpy truth (lib/check_views.py), the torch_dist
# mount of the same model (hf/ and megatron/ byte for byte), and
# gen_megatron.py legacy (megatron/ key by key).  Spec 1.5: a checkpoint
# naming no optimizer format gets the one Megatron assumes.  A .zarray
# outside the spec, a chunk of the wrong size or missing, a bad object
# name: refused at mount with one line naming file, key and reason.

load helpers
load megatron_helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron.py
ITER=ckpt/iter_0000100
ZARR=$FX/megatron-zarr/ckpt

setup_file() {
	local d=$BATS_FILE_TMPDIR
	/usr/bin/python3 "$GEN" zarr --src "$FX/megatron-moe-fp8" \
		--out "$d/zarr-moe-fp8" --old-names --era source
	/usr/bin/python3 "$GEN" zarr \
		--src "$FX/megatron-optim-fully-sharded-model-space" \
		--out "$d/zarr-fsms"
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$FX" "$d" "megatron-untied:2:2:local" \
		"megatron-untied:1:1:te" \
		"megatron-optim-fully-sharded-model-space:2:1:local"
}

setup() {
	setup_ff
}

teardown() {
	megatron_teardown
	teardown_ff
}

# zarr_views FIXTURE SAVEDIR TP [PP]: megatron_views of the zarr save
# directory SAVEDIR, its objects' truth the .pt files themselves (a zarr
# object is torch.save(value), a torch_dist item torch.save([value])), as
# many as the torch_dist fixture's items.
zarr_views() {
	local truth=$BATS_TEST_TMPDIR/truth-${1##*/}
	if [ ! -d "$truth" ]; then
		/usr/bin/python3 "$MEG_TRUTH" "$1" "$truth"
		/usr/bin/python3 - "$truth/manifest.json" "$2/iter_0000100" <<'EOF'
import hashlib, json, os, sys
p, it = sys.argv[1:]
m = json.load(open(p))
objs = {}
for key in os.listdir(it):
    d = os.path.join(it, key)
    for n in os.listdir(d) if os.path.isdir(d) else []:
        if n.startswith("shard_") and n.endswith(".pt"):
            b = open(os.path.join(d, n), "rb").read()
            objs[key + "/" + n[:-3]] = {"length": len(b),
                                        "sha256": hashlib.sha256(b).hexdigest()}
assert len(objs) == len(m["objects"]), (len(objs), len(m["objects"]))
m["objects"] = objs
json.dump(m, open(p, "w"), indent=1)
EOF
	fi
	megatron_views "$1" "$2" "$3" "${4:-}"
}

# same_views A B OPTS DIR...: A and B mounted with OPTS serve DIR (hf,
# megatron, ...) byte for byte alike.
same_views() {
	local a=$1 b=$2 opts=$3 d
	shift 3
	megatron_mount "$a" "$BATS_TEST_TMPDIR/a" "$opts"
	megatron_mount "$b" "$BATS_TEST_TMPDIR/b" "$opts"
	for d in "$@"; do
		run diff -r "$BATS_TEST_TMPDIR/a/$d" "$BATS_TEST_TMPDIR/b/$d"
		echo "$opts $d: $output"
		[ "$status" -eq 0 ]
		[ -n "$(ls "$BATS_TEST_TMPDIR/a/$d")" ]
	done
	megatron_unmount_all
}

@test "megatron zarr (bf16): every view at tp 1,2,4 and pp 2 equals the truth" {
	for tp in 1 2 4; do
		zarr_views "$FX/megatron-untied" "$ZARR" "$tp"
	done
	zarr_views "$FX/megatron-untied" "$ZARR" 2 2
}

@test "megatron zarr: hf/ is the torch_dist mount's byte for byte; index.json names megatron-zarr" {
	same_views "$ZARR" "$FX/megatron-untied/$ITER" tp=2,pp=2 hf
	mount_ff "$ZARR" "$MNT" "tp=2"
	run /usr/bin/python3 - "$MNT/index.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["source"]["format"] == "megatron-zarr", d["source"]
assert d["source"]["writer"] == "Megatron-Core zarr", d["source"]
t = d["tensors"]
assert t["decoder.layers.self_attention.linear_qkv.weight"]["split_axis"] == 1
assert t["embedding.word_embeddings.weight"]["dtype"] in ("bfloat16", "BF16"), t
print("ok")
EOF
	echo "$output"
	[ "$status" -eq 0 ]
	# an object is its .pt file, served as saved
	cmp "$MNT/objects/rng_state%2Fshard_1.0_2.2.pt" \
		"$ZARR/iter_0000100/rng_state/shard_1.0_2.2.pt"
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron zarr: megatron/ legacy files equal Megatron's (tp 2 pp 2 local, tp 1 te)" {
	megatron_legacy \
		"$ZARR|tp=2,pp=2|$BATS_FILE_TMPDIR/exp-megatron-untied-2-2-local" \
		"$ZARR|tp=1,pp=1,megatron_spec=te,megatron_true_vocab=200|$BATS_FILE_TMPDIR/exp-megatron-untied-1-1-te"
}

@test "megatron zarr, FP8 MoE with with_suffix object names: hf/ and megatron/ are the torch_dist mount's" {
	local z=$BATS_FILE_TMPDIR/zarr-moe-fp8 o
	# the expert _extra_states' keys lack the shape's last entry (docs/formats/megatron.md#key-namespaces)
	[ -f "$z/iter_0000100/decoder.layers.mlp.experts.experts.linear_fc1._extra_state/shard_1.3_2.pt" ]
	for o in tp=2,pp=2,megatron_spec=te tp=1,megatron_spec=te,megatron_true_vocab=200 \
		tp=4,pp=2; do
		same_views "$z" "$FX/megatron-moe-fp8/$ITER" "$o" hf megatron
	done
}

@test "megatron zarr, fully_sharded_model_space optimizer at model shape: views equal the truth and torch_dist's hf/" {
	local z=$BATS_FILE_TMPDIR/zarr-fsms
	zarr_views "$FX/megatron-optim-fully-sharded-model-space" "$z" 2
	zarr_views "$FX/megatron-optim-fully-sharded-model-space" "$z" 1 2
	same_views "$z" "$FX/megatron-optim-fully-sharded-model-space/$ITER" \
		tp=2,pp=2 hf
	megatron_legacy "$z|tp=2,pp=1|$BATS_FILE_TMPDIR/exp-megatron-optim-fully-sharded-model-space-2-1-local"
}

# inspect_optim SRC WANT: flexfs-inspect of SRC says "optimizer WANT".
inspect_optim() {
	run --separate-stderr "$FLEXFS_INSPECT" "$1"
	echo "$output" | grep Megatron-Core
	[ "$status" -eq 0 ]
	[[ $output == *"; optimizer $2"$'\n'* ]]
}

@test "docs/formats/megatron.md#optimizer-format-detection: no optimizer format named: fully_sharded_model_space with ckpt_fully_parallel_save, else dp_zero_gather_scatter" {
	local assumed=" (assumed: no format named; from args.ckpt_fully_parallel_save)"
	local src=$FX/megatron-untied/$ITER d=$BATS_TEST_TMPDIR
	inspect_optim "$BATS_FILE_TMPDIR/zarr-fsms" "fully_sharded_model_space$assumed"
	inspect_optim "$ZARR" "dp_zero_gather_scatter$assumed"
	copy_common "$src" "$d/fps" 'del c["content_metadata"]; c["args"].ckpt_fully_parallel_save = True'
	inspect_optim "$d/fps" "fully_sharded_model_space$assumed"
	copy_common "$src" "$d/nofps" 'del c["content_metadata"]; c["args"].ckpt_fully_parallel_save = False'
	inspect_optim "$d/nofps" "dp_zero_gather_scatter$assumed"
	copy_common "$src" "$d/noarg" 'del c["content_metadata"]; del c["args"].ckpt_fully_parallel_save'
	inspect_optim "$d/noarg" "dp_zero_gather_scatter$assumed"
	# a format named in the optimizer leftovers is taken as it is
	copy_common "$src" "$d/named" 'del c["content_metadata"]; c["args"].ckpt_fully_parallel_save = True; c["optimizer"] = {"param_state_sharding_type": "dp_zero_gather_scatter"}'
	inspect_optim "$d/named" "dp_zero_gather_scatter"
	# dp_zero_gather_scatter's state is one opaque object per group: served
	mount_ff "$d/nofps" "$MNT" "tp=2"
	[ -f "$MNT/hf/model.safetensors.index.json" ] || [ -f "$MNT/hf/model.safetensors" ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

# refused EDIT GLOB: a copy of the fixture's iteration with the Python
# statement EDIT run in it (cwd the copy) is refused at mount with one
# line matching GLOB.
refused() {
	local d=$BATS_TEST_TMPDIR/bad
	rm -rf "$d"
	cp -r "$ZARR/iter_0000100" "$d"
	(cd "$d" && /usr/bin/python3 -c "
import json, os
K = 'decoder.layers.self_attention.linear_qkv.weight'
def za(**kw):
    p = K + '/.zarray'
    m = json.load(open(p))
    m.update(kw)
    for k, v in list(m.items()):
        if v == 'DEL':
            del m[k]
    open(p, 'w').write(json.dumps(m))
$1")
	mount_refused_line "$d" "" "$2"
}

@test "megatron zarr: a .zarray outside the spec is refused at mount with one line" {
	local f="*.linear_qkv.weight/.zarray:"
	refused "za(compressor={'id': 'blosc'})" "$f compressor: not null*"
	refused "za(compressor='DEL')" "$f compressor: missing"
	refused "za(order='F')" "$f order: 'F' is not supported*"
	refused "za(filters=[{'id': 'delta', 'dtype': '<f4'}])" "$f filters: not null*"
	refused "za(dtype='<f8')" "$f dtype: '<f8' is not supported (<f4, <f2 or bfloat16)"
	refused "za(dtype='>f4')" "$f dtype: '>f4' is not supported*"
	refused "za(dimension_separator='/')" "$f dimension_separator: '/' is not supported*"
	refused "za(zarr_format=3)" "$f zarr_format: not 2*"
	refused "za(chunks=[1, 32])" "$f chunks: not a list of 3 positive integers*"
	refused "za(shape=[4, -64, 16])" "$f shape: not a list*"
	refused "za(fill_value=[0])" "$f fill_value:*"
	refused "open(K + '/.zarray', 'w').write('{')" "$f not valid JSON*"
}

@test "megatron zarr: a chunk missing or of the wrong size, a bad object name: refused with one line" {
	local k=decoder.layers.self_attention.linear_qkv.weight
	refused "os.remove(K + '/2.1.0')" "*/$k/2.1.0: $k: missing chunk*"
	refused "open(K + '/0.1.0', 'ab').write(b'x')" "*/$k/0.1.0: $k: 1025 bytes, not a chunk's 1024"
	refused "os.truncate(K + '/3.0.0', 0)" "*/$k/3.0.0: $k: 0 bytes, not a chunk's 1024"
	refused "open('rng_state/shard_x_1.pt', 'wb')" "*/rng_state/shard_x_1.pt: not a ShardedObject file name*"
	refused "open('rng_state/shard_1.0.0_2.pt', 'wb')" "*/rng_state/shard_1.0.0_2.pt: not a ShardedObject file name*"
	# a tensor directory whose .zarray is gone: refused, not dropped
	refused "os.remove(K + '/.zarray')" "*/$k/0.0.0: a chunk file, but no $k/.zarray describes its array"
	# the grid is larger than the files the directory has
	refused "za(shape=[400, 64, 16])" "*/$k/.zarray: chunks: a grid of more chunks than the directory has files*"
}

@test "megatron zarr: anything beside the key directories stays as it is" {
	local d=$BATS_TEST_TMPDIR/z
	cp -r "$ZARR/iter_0000100" "$d"
	mkdir "$d/tokenizer" && echo '{}' >"$d/tokenizer/tokenizer.json"
	# a .zattrs in an array directory is Zarr's and ignored
	echo '{}' >"$d/output_layer.weight/.zattrs"
	run --separate-stderr "$FLEXFS_INSPECT" "$d"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"9 tensors"*", 20 objects"* ]]
}

@test "megatron zarr: chunks that do not divide the shape (Zarr pads the edge chunks) are read without the padding" {
	local d=$BATS_TEST_TMPDIR/edge
	mkdir "$d"
	cp -r "$ZARR/iter_0000100" "$d/iter_0000100"
	# output_layer.weight [256, 16] bf16 as chunks of 100 rows: the third
	# holds rows 200-255 and 44 rows of padding (0xff bytes)
	(cd "$d/iter_0000100/output_layer.weight" && /usr/bin/python3 -c "
import json, os
m = json.load(open('.zarray'))
rows = open('0.0', 'rb').read() + open('1.0', 'rb').read()
row = 16 * 2
for n in ('0.0', '1.0'):
    os.remove(n)
for i in range(3):
    c = rows[i * 100 * row:(i + 1) * 100 * row]
    open('%d.0' % i, 'wb').write(c + b'\xff' * (100 * row - len(c)))
m['chunks'] = [100, 16]
open('.zarray', 'w').write(json.dumps(m))")
	cp "$ZARR/latest_checkpointed_iteration.txt" "$d/"
	same_views "$d" "$FX/megatron-untied/$ITER" tp=2 hf
	# ranks/: each rank's rows cross the chunks' edges
	zarr_views "$FX/megatron-untied" "$d" 2
}
