#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Issue 18: placement problems never hide the table (flexfs-inspect shows
# every tensor, marks and lists the undecided ones, writes a rules template
# that mounts as is; the mount names them in one line); FSDP-aware split
# inference and rules presets; filters; symlinked extras and warnings.
# The oracle is lib/check_views.py (its own placement) and the fixtures'
# truth files.

load helpers

CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py
T113=$FLEXFS_SRC/tests/fixtures/dcp-t113

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

@test "inspect: an undecided split shows the whole table, marks and lists it, exits 1" {
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o tp=2
	echo "status=$status stderr=$stderr"
	[[ $status -eq 1 ]]
	[[ ${lines[0]} == TENSOR* ]]
	# every tensor is in the table (27), the undecided one marked '?'
	[[ $(sed -n '2,/^$/p' <<<"$output" | grep -c .) -eq 27 ]]
	grep -Eq '^block\.weight +float32 +8x12 +4 \(axes 0,1\) +\? ' <<<"$output"
	grep -Eq '^tok_embeddings\.weight .* 0 +0 +r0-1: 16x16$' <<<"$output"
	[[ ${stderr_lines[0]} == *"1 tensor(s) saved split along several axes"* ]]
	[[ ${stderr_lines[1]} == "  block.weight (saved along axes 0,1)" ]]
	[[ ${stderr_lines[2]} == *"--rules-template=FILE"* ]]
	# the same checkpoint with a rule: exit 0, nothing on stderr
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o "tp=2,rules=$RULES"
	[[ $status -eq 0 && -z $stderr ]]
}

@test "mount: undecided splits are one line naming them, the count and --rules-template" {
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o tp=2 3>&-
	echo "status=$status stderr=$stderr"
	[[ $status -ne 0 && ${#stderr_lines[@]} -eq 1 ]]
	[[ $stderr == "flexfs: "*"/.metadata: block.weight: 1 tensor(s) saved split along several axes; add a rule"*"flexfs-inspect --rules-template=FILE"* ]]
	[[ -z $(mountinfo_of "$MNT") ]]
}

@test "inspect --rules-template writes a rules file that mounts as is (views checked)" {
	require_fuse
	local tmpl=$BATS_TEST_TMPDIR/tmpl.json
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o tp=2 \
		--rules-template="$tmpl"
	echo "status=$status stderr=$stderr"
	[[ $status -eq 0 ]]
	[[ $stderr == *"wrote 1 rule(s) to $tmpl"* ]]
	run /usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r == [{"match": "block.weight", "split": None, "note": r[0]["note"]}], r
assert "axes 0,1" in r[0]["note"], r' "$tmpl"
	[[ $status -eq 0 ]]
	# "-" writes it to stdout, alone
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o tp=2 \
		--rules-template=-
	[[ $status -eq 0 && $output == "$(cat "$tmpl")" ]]
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$tmpl"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$T113/truth" \
		--tp 2 --pp 1 --rules "$tmpl"
	echo "$output"
	[[ $status -eq 0 && $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
}

# check_fsdp FIXTURE TP PP [OPTS]: mount, every view against the truth
# (the oracle infers FSDP's shards itself), unmount.
check_fsdp() {
	local fx=$FLEXFS_SRC/tests/fixtures/$1 tp=$2 pp=$3 opts=${4:-}

	mount_ff "$fx/ckpt" "$MNT" "tp=$tp,pp=$pp${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$fx/truth" \
		--tp "$tp" --pp "$pp" ${5:+--rules "$5"}
	echo "$1 tp=$tp pp=$pp: $output"
	[[ $status -eq 0 && $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	[[ $FF_RC -eq 0 ]]
}

@test "FSDP2 x TP (torch 2.6, 4 gloo ranks): every target mounts without a rule, views exact" {
	require_fuse
	# tp=1: no rule, nothing said
	run --separate-stderr "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt"
	[[ $status -eq 0 && -z $stderr ]]
	[[ $output != *"data-parallel"* ]]
	check_fsdp fsdp2-tp 2 2
	# said once, in one line
	[[ $(wc -l <"$FF_ERR") -eq 1 ]]
	grep -q "every tensor was saved in 2 data-parallel shards along dim 0 (FSDP)" "$FF_ERR"
	check_fsdp fsdp2-tp 4 1
}

@test "FSDP2 x TP: the TP axis is inferred from the other axis, FSDP's alone replicates" {
	run --separate-stderr "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt" -o tp=2
	# the mount's note, and nothing else
	[[ $status -eq 0 && $(wc -l <<<"$stderr") -eq 1 ]]
	[[ $stderr == *"every tensor was saved in 2 data-parallel shards along dim 0 (FSDP)"* ]]
	# rowwise (FSDP axis 0 + TP axis 1), strided colwise, norms
	grep -Eq '^model\.layers\.0\.attention\.wo\.weight +float32 +12x12 +4 \(axes 0,1\) +1 ' <<<"$output"
	grep -Eq '^model\.layers\.0\.feed_forward\.w1\.weight +float32 +24x12 +4 \(axis 0\) +0 ' <<<"$output"
	grep -Eq '^model\.norm\.weight +float32 +12 +2 \(axis 0\) +- ' <<<"$output"
	grep -Eq '^optim\.state\.layers\.1\.feed_forward\.w2\.weight\.exp_avg +float32 +12x24 +4 \(axes 0,1\) +1 ' <<<"$output"
	[[ $output == *"every tensor was saved in 2 data-parallel shards"* ]]
}

@test "FSDP2 alone: its dim-0 split is not a TP split, everything replicated, views exact" {
	require_fuse
	check_fsdp fsdp2 2 1
	grep -q "every tensor was saved in 4 data-parallel shards" "$FF_ERR"
	run --separate-stderr "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/fsdp2/ckpt" -o tp=2
	[[ $status -eq 0 ]]
	! grep -Eq '^model\..* [0-9]+ +0 +r0' <<<"$output"
	grep -Eq '^model\.layers\.0\.feed_forward\.w2\.weight +float32 +10x22 +4 \(axis 0\) +- ' <<<"$output"
}

PRESETS=$FLEXFS_SRC/reshard/presets

# same_plan DIR OPTS_A OPTS_B: inspect's table (less the rules line) is the
# same under both option strings.
same_plan() {
	diff <("$FLEXFS_INSPECT" "$1" -o "$2" | grep -v 'rules: ') \
		<("$FLEXFS_INSPECT" "$1" -o "$3" | grep -v 'rules: ')
}

@test "presets: listed with what they are, each loads (found beside the binary, no env)" {
	run --separate-stderr "$FLEXFS_INSPECT" --list-presets
	echo "$output $stderr"
	[[ $status -eq 0 && -z $stderr ]]
	[[ ${lines[0]} == "rules presets in "*"/share/flexfs/rules (mount with -o rules=@NAME):" ]]
	[[ ${#lines[@]} -eq 12 ]]
	[[ ${lines[1]} == "@hf-llama-to-megatron-gpt "* ]]
	[[ ${lines[2]} == "@hf-llama-to-paddlenlp-llama-fused "*"fuse_attention_qkv"* ]]
	[[ ${lines[3]} == "@hf-llama-to-paddlenlp-llama "* ]]
	[[ ${lines[4]} == "@hf-llama "*"Hugging Face Llama, Qwen2, Mistral"* ]]
	[[ ${lines[5]} == "@hf-mistral "* && ${lines[6]} == "@hf-qwen2 "* ]]
	[[ ${lines[7]} == "@megatron-gpt-to-hf-llama "* ]]
	[[ ${lines[8]} == "@megatron-gpt "*"Megatron GPT"* ]]
	[[ ${lines[9]} == "@paddlenlp-llama-fused-to-hf-llama "*"fuse_attention_qkv"* ]]
	[[ ${lines[10]} == "@paddlenlp-llama-to-hf-llama "* ]]
	[[ ${lines[11]} == "@torchtitan-llama "*"torchtitan Llama 3"* ]]
	# FLEXFS_PRESET_DIR overrides; a bad or unknown name is one line
	run --separate-stderr env FLEXFS_PRESET_DIR=$BATS_TEST_TMPDIR "$FLEXFS_INSPECT" --list-presets
	[[ $status -eq 0 && ${#lines[@]} -eq 1 ]]
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o rules=@nope 3>&-
	[[ $status -ne 0 && ${#stderr_lines[@]} -eq 1 ]]
	[[ $stderr == *"no preset 'nope' (see flexfs-inspect --list-presets)"* ]]
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o rules=@../rules 3>&-
	[[ $status -ne 0 && $stderr == *"'@../rules' is not a preset name"* ]]
}

@test "preset torchtitan-llama: the TP plan torch saved in the FSDP2 x TP fixture, views exact" {
	require_fuse
	local fx=$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt
	same_plan "$fx" tp=2 tp=2,rules=@torchtitan-llama
	same_plan "$fx" tp=4 tp=4,rules=@torchtitan-llama
	# (the same placement as inferred, whose views the test above checks)
	# on the FSDP-only checkpoint it gives the TP splits inference cannot
	run "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/fsdp2/ckpt" -o tp=2,rules=@torchtitan-llama
	grep -Eq '^model\.layers\.0\.attention\.wo\.weight +float32 +10x10 +4 \(axis 0\) +1 ' <<<"$output"
	check_fsdp fsdp2 2 1 rules=@torchtitan-llama "$PRESETS/torchtitan-llama.json"
}

# same_plan_glu DIR OPTS_A OPTS_B [FC1 AXIS]: same_plan, except that the
# SwiGLU linear_fc1 (FC1, an ERE of its name's start, default the dense
# decoder\.layers\.mlp\.linear_fc1; SPLIT AXIS, default 1, under OPTS_A) is
# split as [gate_r; up_r] (SPLIT AXISx2) under OPTS_B, which must say so
# (presets_swiglu.bats checks its bytes).
same_plan_glu() {
	local b fc1=${4:-'decoder\.layers\.mlp\.linear_fc1'} a=${5:-1}
	b=$("$FLEXFS_INSPECT" "$1" -o "$3" | grep -v 'rules: ')
	grep -Eq "^$fc1\\.weight .* ${a}x2 +0 " <<<"$b"
	diff <("$FLEXFS_INSPECT" "$1" -o "$2" | grep -v 'rules: ') \
		<(sed -E "/^$fc1\\./s/ ${a}x2 / $a   /" <<<"$b")
}

@test "preset megatron-gpt: the TP plan Megatron saved, on every Megatron fixture" {
	local f d
	for f in megatron-untied megatron-tied megatron-optim-fully-reshardable; do
		d=$(echo "$FLEXFS_SRC"/tests/fixtures/$f/ckpt/iter_*)
		same_plan_glu "$d" tp=2 tp=2,rules=@megatron-gpt
		same_plan_glu "$d" tp=4 tp=4,rules=@megatron-gpt
	done
	d=$(echo "$FLEXFS_SRC"/tests/fixtures/megatron-moe/ckpt/iter_*)
	# the experts' fc1 stacks [layer, expert]: rows are axis 2
	same_plan_glu "$d" tp=2 tp=2,rules=@megatron-gpt \
		'decoder\.layers\.mlp\.experts\.experts\.linear_fc1' 2
	same_plan_glu "$d" tp=4 tp=4,rules=@megatron-gpt \
		'decoder\.layers\.mlp\.experts\.experts\.linear_fc1' 2
	# and it decides what a checkpoint saved whole cannot: linear_proj on
	# its input axis (2, past the stacked layers)
	run "$FLEXFS_INSPECT" "$d" -o tp=2,rules=@megatron-gpt
	grep -Eq '^decoder\.layers\.self_attention\.linear_proj\.weight .* +2 +0 +r0-1: ' <<<"$output"
}

@test "presets hf-llama, hf-qwen2, hf-mistral mount hf-tiny, views exact" {
	require_fuse
	local hf=$FLEXFS_SRC/tests/fixtures/hf-tiny p
	mount_ff "$hf/single" "$MNT" "tp=2,rules=@hf-llama"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$hf/truth" \
		--tp 2 --pp 1 --rules "$PRESETS/hf-llama.json"
	echo "$output"
	[[ $status -eq 0 && $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	for p in hf-qwen2 hf-mistral; do
		same_plan "$hf/sharded" tp=2,rules=@hf-llama tp=2,rules=@$p
	done
	# transformers' plan: q_proj colwise, o_proj rowwise, embed_tokens whole
	run "$FLEXFS_INSPECT" "$hf/single" -o tp=2,rules=@hf-qwen2
	grep -Eq '^model\.layers\.0\.self_attn\.q_proj\.weight .* 0 +0 +r0' <<<"$output"
	grep -Eq '^model\.layers\.0\.self_attn\.o_proj\.weight .* 1 +0 +r0' <<<"$output"
	grep -Eq '^model\.embed_tokens\.weight .* - +0 +r0-1' <<<"$output"
}

# filtered_truth TRUTH PREFIX OUT: TRUTH's manifest with only the tensors
# named PREFIX*, PREFIX cut, no objects (the oracle of include= +
# strip_prefix=, written independently of flexfs).
filtered_truth() {
	mkdir -p "$3"
	/usr/bin/python3 - "$@" <<'PY'
import json, os, sys
src, pre, out = sys.argv[1:4]
m = json.load(open(os.path.join(src, "manifest.json")))
t = {k[len(pre):]: dict(v, file=os.path.join(src, v["file"]))
     for k, v in m["tensors"].items() if k.startswith(pre)}
m.update(tensors=t, objects={})
json.dump(m, open(os.path.join(out, "manifest.json"), "w"))
PY
}

@test "include= + strip_prefix=: an HF directory of the weights only, names without model., views exact" {
	require_fuse
	local fx=$FLEXFS_SRC/tests/fixtures/fsdp2-tp truth=$BATS_TEST_TMPDIR/truth
	filtered_truth "$fx/truth" model. "$truth"
	mount_ff "$fx/ckpt" "$MNT" "tp=2,include=model.*,strip_prefix=model."
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$truth" --tp 2 --pp 1
	echo "$output"
	[[ $status -eq 0 && $output == *" passed, 0 failed"* ]]
	[[ ! -e $MNT/objects ]] || [[ -z $(ls -A "$MNT/objects") ]]
	/usr/bin/python3 - "$MNT/hf/model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
names = sorted(k for k in h if k != "__metadata__")
assert len(names) == 21 and "tok_embeddings.weight" in names, names
assert not any(n.startswith(("model.", "optim.")) for n in names), names
PY
	unmount_ff "$MNT"
}

@test "exclude= (':' and repeated), include= matching nothing, bad globs: inspect and mount" {
	local fx=$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt
	run "$FLEXFS_INSPECT" "$fx" -o "exclude=optim.*"
	[[ $status -eq 0 && $output == *"21 tensors"*", 0 objects"* ]]
	run "$FLEXFS_INSPECT" "$fx" -o "exclude=optim.*.exp_avg:optim.*.exp_avg_sq,exclude=optim.*.step"
	[[ $status -eq 0 && $output == *"21 tensors"*", 11 objects"* ]]
	run "$FLEXFS_INSPECT" "$fx" -o "include=model.norm.*,include=*.step,strip_prefix=optim.state."
	[[ $status -eq 0 && $output == *$'\nmodel.norm.weight '* && $output == *$'\nnorm.weight.step '* ]]
	run --separate-stderr "$FLEXFS_BIN" "$fx" "$MNT" -o "include=nothing.*" 3>&-
	[[ $status -ne 0 && ${#stderr_lines[@]} -eq 1 ]]
	[[ $stderr == "flexfs: include: no tensor passes include= and exclude= (of 84)" ]]
	run --separate-stderr "$FLEXFS_BIN" "$fx" "$MNT" -o "exclude=a::b" 3>&-
	[[ $status -ne 0 && $stderr == *"exclude: an empty glob in 'a::b'"* ]]
}

@test "symlinked extras: inside followed, outside skipped and named in one line, follow_symlinks serves them" {
	require_fuse
	local hf=$FLEXFS_SRC/tests/fixtures/hf-tiny ck=$BATS_TEST_TMPDIR/ck out=$BATS_TEST_TMPDIR/outside
	mkdir -p "$ck/sub" "$out"
	cp "$hf/single/model.safetensors" "$ck/"
	cp "$hf/single/config.json" "$ck/sub/"
	cp "$hf/single/tokenizer.json" "$out/"
	ln -s sub/config.json "$ck/config.json"
	ln -s "$out/tokenizer.json" "$ck/tokenizer.json"
	ln -s nowhere "$ck/dangling.txt"
	mount_ff "$ck" "$MNT" ""
	cmp "$MNT/hf/config.json" "$hf/single/config.json"
	[[ ! -e $MNT/hf/tokenizer.json && ! -e $MNT/hf/dangling.txt ]]
	unmount_ff "$MNT"
	cat "$FF_ERR"
	[[ $(grep -vcF "$FF_DTYPE_NOTE" "$FF_ERR") -eq 1 ]]
	grep -q "flexfs: $ck: 2 symlinked file(s) not served (leading outside the directory, dangling or not to a file; -o follow_symlinks follows them outside): dangling.txt, tokenizer.json" "$FF_ERR"
	mount_ff "$ck" "$MNT" "follow_symlinks"
	cmp "$MNT/hf/tokenizer.json" "$hf/single/tokenizer.json"
	unmount_ff "$MNT"
	grep -q "1 symlinked file(s) not served.*: dangling.txt$" "$FF_ERR"
}

@test "a Hugging Face cache snapshot (every file a link into ../../blobs) mounts with follow_symlinks, views exact" {
	require_fuse
	local hf=$FLEXFS_SRC/tests/fixtures/hf-tiny cache=$BATS_TEST_TMPDIR/hub/models--t--tiny f
	mkdir -p "$cache/blobs" "$cache/snapshots/abc"
	for f in model.safetensors config.json tokenizer.json; do
		cp "$hf/single/$f" "$cache/blobs/$f.blob"
		ln -s "../../blobs/$f.blob" "$cache/snapshots/abc/$f"
	done
	run --separate-stderr "$FLEXFS_BIN" "$cache/snapshots/abc" "$MNT" 3>&-
	[[ $status -ne 0 && $stderr == *"model.safetensors"*"outside the checkpoint directory"* ]]
	mount_ff "$cache/snapshots/abc" "$MNT" "follow_symlinks"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$hf/truth" --tp 1 --pp 1
	echo "$output"
	[[ $status -eq 0 && $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	ff_quiet
}

@test "warnings at mount: empty PP stages, rules that match no tensor (a preset says nothing)" {
	require_fuse
	local r=$BATS_TEST_TMPDIR/r.json
	echo '[{"match": "nothing*", "split": null}, {"match": "block.weight", "split": 1}, {"match": "block.*", "split": 0}]' >"$r"
	mount_ff "$FIXTURE" "$MNT" "tp=2,pp=6,rules=$r"
	[[ -d $MNT/ranks/tp00_pp04 ]]
	unmount_ff "$MNT"
	cat "$FF_ERR"
	[[ $(wc -l <"$FF_ERR") -eq 2 ]]
	grep -qx "flexfs: $FIXTURE: pp=6 over 4 layer(s) leaves stage(s) 4 without any tensor" "$FF_ERR"
	grep -qx "flexfs: $FIXTURE: $r: rule(s) 0 ('nothing\*'), 2 ('block\.\*') match no tensor (each tensor takes the first rule matching it)" "$FF_ERR"
	mount_ff "$FLEXFS_SRC/tests/fixtures/hf-tiny/single" "$MNT" "tp=2,rules=@hf-llama"
	unmount_ff "$MNT"
	ff_quiet
}

@test "mount points: a non-empty one is refused unless nonempty, a flexfs mount is refused" {
	require_fuse
	touch "$MNT/file"
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o "tp=2,rules=$RULES" 3>&-
	echo "$stderr"
	[[ $status -ne 0 && ${#stderr_lines[@]} -eq 1 ]]
	[[ $stderr == "flexfs: $MNT: is not empty: the mount would hide its files (mount with -o nonempty to mount over them)" ]]
	[[ -z $(mountinfo_of "$MNT") ]]
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES,nonempty"
	[[ -f $MNT/index.json ]]
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -o "tp=2,rules=$RULES,nonempty" 3>&-
	echo "$stderr"
	[[ $status -ne 0 && ${#stderr_lines[@]} -eq 1 ]]
	[[ $stderr == "flexfs: $MNT: is already a flexfs mount (unmount it first: fusermount3 -u)" ]]
	[[ $(mountinfo_of "$MNT" | wc -l) -eq 1 ]]
	unmount_ff "$MNT"
	[[ -f $MNT/file ]]
}

@test "inspect: the table is in natural name order (layers.2 before layers.10)" {
	local ck=$BATS_TEST_TMPDIR/nat
	mkdir -p "$ck"
	/usr/bin/python3 - "$ck/model.safetensors" <<'PY'
import json, struct, sys
names = ["layers.10.w", "layers.2.w", "layers.1.w", "b", "a10", "a9", "layers.02x"]
h, off = {}, 0
for n in names:
    h[n] = {"dtype": "F32", "shape": [1], "data_offsets": [off, off + 4]}
    off += 4
j = json.dumps(h).encode()
j += b" " * (-len(j) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(j)) + j + bytes(off))
PY
	run --separate-stderr "$FLEXFS_INSPECT" "$ck"
	[[ $status -eq 0 ]]
	local got
	got=$(sed -n '2,/^$/p' <<<"$output" | awk 'NF {print $1}' | paste -sd' ')
	[[ $got == "a9 a10 b layers.1.w layers.2.w layers.02x layers.10.w" ]]
}

@test "cmake --install puts flexfs, flexfs-inspect and the presets in place; installed, they find the presets" {
	local dest=$BATS_TEST_TMPDIR/dest build
	build=$(dirname "$FLEXFS_BUILD")
	[[ -f $build/CMakeCache.txt ]] || skip "no CMake build tree at $build"
	run env DESTDIR="$dest" cmake --install "$build"
	[[ $status -eq 0 ]]
	local prefix
	prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
	[[ -x $dest$prefix/bin/flexfs && -x $dest$prefix/bin/flexfs-inspect ]]
	run --separate-stderr "$dest$prefix/bin/flexfs-inspect" --list-presets
	echo "$output $stderr"
	[[ $status -eq 0 && ${lines[0]} == "rules presets in $dest$prefix/share/flexfs/rules "* ]]
	[[ ${#lines[@]} -eq 12 && -z $stderr ]]
	run "$dest$prefix/bin/flexfs-inspect" "$FLEXFS_SRC/tests/fixtures/fsdp2/ckpt" -o tp=2,rules=@torchtitan-llama
	[[ $status -eq 0 && $output == *"rules: $dest$prefix/share/flexfs/rules/torchtitan-llama.json"* ]]
}

# digest_check CKPT TRUTH [OPTS]: every line of --digest is the truth's
# sha256 of the full tensor (written by the fixture's generator from the
# tensors torch held), and every truth tensor has one.
digest_check() {
	run --separate-stderr "$FLEXFS_INSPECT" "$1" --digest ${3:+-o "$3"}
	[[ $status -eq 0 ]]
	printf '%s\n' "$output" >"$BATS_TEST_TMPDIR/digests"
	/usr/bin/python3 - "$2/manifest.json" "$BATS_TEST_TMPDIR/digests" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["tensors"]
got = {}
for line in open(sys.argv[2]).read().splitlines():
    h, dtype, shape, name = line.split()
    got[name] = h
    assert t[name]["sha256"] == h, (name, h)
    assert dtype == t[name]["dtype"], (name, dtype)
assert set(got) == set(t), set(got) ^ set(t)
print(len(got), "digests match")
PY
}

@test "--digest: the sha256 of each whole tensor, whatever the layout it was saved in" {
	digest_check "$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt" "$FLEXFS_SRC/tests/fixtures/fsdp2-tp/truth" tp=2
	digest_check "$FLEXFS_SRC/tests/fixtures/fsdp2/ckpt" "$FLEXFS_SRC/tests/fixtures/fsdp2/truth"
	digest_check "$FIXTURE" "$T113/truth"
	digest_check "$FLEXFS_SRC/tests/fixtures/hf-tiny/sharded" "$FLEXFS_SRC/tests/fixtures/hf-tiny/truth"
	# natural name order
	run "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/fsdp2/ckpt" --digest
	[[ $(awk '{print $4}' <<<"$output" | head -3 | paste -sd' ') == "model.layers.0.attention.wk.weight model.layers.0.attention.wo.weight model.layers.0.attention.wq.weight" ]]
}

@test "--compare: two layouts of one model are identical; differences are named, exit 1" {
	local hf=$FLEXFS_SRC/tests/fixtures/hf-tiny
	run --separate-stderr "$FLEXFS_INSPECT" "$hf/single" --compare "$hf/sharded"
	[[ $status -eq 0 && ${lines[-1]} == "44 tensor(s) identical, 0 difference(s)" ]]
	# the same tensors in a DCP checkpoint written by torch 1.13 and 2.6
	local a=$FLEXFS_SRC/tests/fixtures/dcp-t113 b=$FLEXFS_SRC/tests/fixtures/dcp-t26
	run --separate-stderr "$FLEXFS_INSPECT" "$a/ckpt" --compare "$b/ckpt"
	echo "$output"
	local want
	want=$(/usr/bin/python3 - "$a/truth/manifest.json" "$b/truth/manifest.json" <<'PY'
import json, sys
x, y = (json.load(open(p))["tensors"] for p in sys.argv[1:3])
same = sum(1 for k in x if k in y and all(x[k][f] == y[k][f] for f in ("dtype", "shape", "sha256")))
print("%d tensor(s) identical, %d difference(s)" % (same, len(set(x) | set(y)) - same))
PY
)
	[[ ${lines[-1]} == "$want" ]]
	[[ $want == *", 0 difference(s)" ]] && [[ $status -eq 0 ]] || [[ $status -eq 1 ]]
	# a different checkpoint: named differences, exit 1
	run --separate-stderr "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/fsdp2/ckpt" \
		--compare "$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt" -o "include=model.*"
	[[ $status -eq 1 ]]
	[[ $output == *"shape differs: model.norm.weight: 10 vs 12"* ]]
	[[ ${lines[-1]} == "0 tensor(s) identical, 21 difference(s)" ]]
}
