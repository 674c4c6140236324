#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# A Megatron-LM legacy save directory (--ckpt-format torch: iter_N/
# mp_rank_TT[_PPP]/model_optim_rng.pt) as the source (megatron-legacy,
# docs/formats/megatron-legacy.md).  Fixtures: tools/fixtures/
# gen_megatron_legacy_src.py, real torch.save of the seeded global tensors
# of tests/fixtures/megatron-{untied,tied,gpt-bias} split as Megatron does
# (gen_megatron.py's legacy writer), plus the optimizer, scheduler and rng
# state; written here at tp2 pp1, tp1 pp2 (tied), tp2 pp2 with a virtual
# pipeline of 2, and tp2 pp2 with Transformer Engine names and biases; and
# tests/fixtures/megatron-moe's MoE model (4 experts) with expert
# parallelism 2: tp2 pp1 (mp_rank_TT_EEE), tp2 pp2 with TE names
# (mp_rank_TT_PPP_EEE), and tp2 pp1 as TEGroupedMLP (args.moe_grouped_gemm:
# experts.linear_fc1.weight<e>).
# Oracles: every view against the global tensors (lib/check_views.py), and
# megatron/ (torch.load-ed, key by key: lib/check_megatron_legacy.py)
# against the files as saved (at the saved layout) or gen_megatron.py's
# legacy writer's (at another).

load helpers
load megatron_helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron_legacy_src.py
ORACLES=$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py
ITER=iter_0000100

# NAME:FIXTURE:TP:PP:VP:SPEC[:EP] of the legacy saves (FIXTURE under
# tests/fixtures, else under the file's temporary directory)
saves() {
	echo "u21:megatron-untied:2:1:1:local"
	echo "t12:megatron-tied:1:2:1:local"
	echo "u22v:megatron-untied:2:2:2:local"
	echo "b22te:megatron-gpt-bias:2:2:1:te"
	echo "e21:megatron-moe:2:1:1:local:2"
	echo "e22te:megatron-moe:2:2:1:te:2"
	echo "g21te:megatron-moe-grouped:2:1:1:te:2"
}

setup_file() {
	local d=$BATS_FILE_TMPDIR s n fx tp pp vp sp ep src
	# megatron-moe as a run with --moe-grouped-gemm saved it
	cp -r "$FX/megatron-moe" "$d/megatron-moe-grouped"
	/usr/bin/python3 - "$FLEXFS_SRC/tools/fixtures/gen_megatron.py" "$MEG_STUB" \
		"$d/megatron-moe-grouped" <<'PY'
import importlib.util, os, sys
sys.path.insert(0, sys.argv[2])
spec = importlib.util.spec_from_file_location("g", sys.argv[1])
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)
import torch
c = g.load_common(sys.argv[3])
c["args"].moe_grouped_gemm = True
torch.save(c, os.path.join(sys.argv[3], "ckpt", g.ITER_DIR, "common.pt"))
PY
	for s in $(saves); do
		IFS=: read -r n fx tp pp vp sp ep <<<"$s"
		src=$FX/$fx
		[ -d "$src" ] || src=$d/$fx
		/usr/bin/python3 "$GEN" --src "$src" --tp "$tp" --pp "$pp" \
			--vp "$vp" --ep "${ep:-1}" --spec "$sp" --out "$d/$n" >/dev/null
	done
	/usr/bin/python3 "$ORACLES" "$FLEXFS_SRC/tools/fixtures/gen_megatron.py" \
		"$FX" "$d" megatron-tied:2:2:local megatron-untied:1:2:local \
		megatron-gpt-bias:1:2:te megatron-gpt-bias:2:1:local \
		megatron-untied:2:1:local:vp2 megatron-moe:1:2:local \
		megatron-moe:1:1:local:ep4 megatron-moe:2:2:te
	/usr/bin/python3 "$ORACLES" "$FLEXFS_SRC/tools/fixtures/gen_megatron.py" \
		"$d" "$d" megatron-moe-grouped:1:1:te:ep4
}

setup() {
	setup_ff
}

teardown() {
	megatron_teardown
	mountpoint -q "$MNT" && fusermount3 -u -z "$MNT"
	teardown_ff
}

# views NAME TP PP [DIR]: every view of save NAME (or of DIR) mounted at
# tp x pp equals NAME's truth; the daemon exits 0 and says nothing.
views() {
	local d=$BATS_FILE_TMPDIR/$1
	mount_ff "${4:-$d/ckpt}" "$MNT" "tp=$2,pp=$3"
	run /usr/bin/python3 "$MEG_VIEWS" -q --mount "$MNT" --truth "$d/truth" \
		--tp "$2" --pp "$3"
	echo "$1 tp=$2 pp=$3: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

# views_changed NAME TP PP DIR: views NAME TP PP DIR, whose rank files
# (the objects) differ from NAME's: the truth's objects are DIR's files.
views_changed() {
	rm -rf "$BATS_TEST_TMPDIR/$1"
	cp -r "$BATS_FILE_TMPDIR/$1" "$BATS_TEST_TMPDIR/$1"
	/usr/bin/python3 - "$4" "$BATS_TEST_TMPDIR/$1/truth/manifest.json" <<'PY'
import hashlib, json, os, sys
man = json.load(open(sys.argv[2]))
for r in man["objects"]:
    b = open(os.path.join(sys.argv[1], r, "model_optim_rng.pt"), "rb").read()
    man["objects"][r] = {"length": len(b), "sha256": hashlib.sha256(b).hexdigest()}
json.dump(man, open(sys.argv[2], "w"))
PY
	BATS_FILE_TMPDIR=$BATS_TEST_TMPDIR views "$@"
}

# legacy NAME OPTS EXPECTED: megatron/ of save NAME mounted with OPTS equals
# the files in EXPECTED.
legacy() {
	mount_ff "$BATS_FILE_TMPDIR/$1/ckpt" "$MNT" "$2"
	megatron_legacy_run "$MNT" "$3"
	megatron_legacy_passed
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

# refused DIR OPTS WANT...: the mount fails with one line matching each.
refused() {
	local d=$1 o=$2
	shift 2
	mount_refused_line "$d" "$o" "$@"
}

# mutate NAME SCRIPT: a copy of save NAME's iteration directory, changed
# by the python SCRIPT (torch imported, d the copy, load/save helpers);
# prints the copy's path.
mutate() {
	local d=$BATS_TEST_TMPDIR/$1-bad
	rm -rf "$d"
	cp -r "$BATS_FILE_TMPDIR/$1/ckpt/$ITER" "$d"
	/usr/bin/python3 - "$d" "$MEG_STUB" <<PY
import os, sys
sys.path.insert(0, sys.argv[2])
import torch
d = sys.argv[1]
def load(r):
    return torch.load(os.path.join(d, r, "model_optim_rng.pt"))
def save(r, sd):
    torch.save(sd, os.path.join(d, r, "model_optim_rng.pt"))
$2
PY
	echo "$d"
}

@test "megatron-legacy: every view at tp 1,2,4 x pp 1,2 equals the global tensors" {
	local s n rest tp pp
	for s in $(saves); do
		IFS=: read -r n rest <<<"$s"
		for tp in 1 2 4; do
			for pp in 1 2; do
				views "$n" "$tp" "$pp"
			done
		done
	done
}

@test "megatron-legacy: index.json names the source and the save's layout" {
	mount_ff "$BATS_FILE_TMPDIR/u22v/ckpt" "$MNT" "tp=1"
	run cat "$MNT/index.json"
	[[ $output == *"megatron-legacy"* ]]
	[[ $output == *"u22v/ckpt/$ITER"* ]]
	unmount_ff "$MNT"
}

@test "megatron-legacy: megatron/ at the saved layout gives back the saved args, iteration and model" {
	legacy u21 tp=2,pp=1 "$BATS_FILE_TMPDIR/u21/model-only"
	legacy t12 tp=1,pp=2 "$BATS_FILE_TMPDIR/t12/model-only"
	legacy u22v tp=2,pp=2,megatron_vp=2 "$BATS_FILE_TMPDIR/u22v/model-only"
	legacy b22te tp=2,pp=2,megatron_spec=te "$BATS_FILE_TMPDIR/b22te/model-only"
}

@test "megatron-legacy: an expert-parallel save's megatron/ at its layout gives back its files" {
	legacy e21 tp=2,pp=1,megatron_ep=2 "$BATS_FILE_TMPDIR/e21/model-only"
	legacy e22te tp=2,pp=2,megatron_ep=2,megatron_spec=te "$BATS_FILE_TMPDIR/e22te/model-only"
	legacy g21te tp=2,pp=1,megatron_ep=2,megatron_spec=te "$BATS_FILE_TMPDIR/g21te/model-only"
}

@test "megatron-legacy: megatron/ at another layout equals Megatron's legacy writer" {
	local e=$BATS_FILE_TMPDIR
	# tp 1 from a tp 2 save: the padding depends on the true vocab (200,
	# docs/facts.md); the oracle's re-padding of the saved 256 rows is the same
	legacy t12 tp=2,pp=2 "$e/exp-megatron-tied-2-2-local"
	legacy u21 tp=1,pp=2,megatron_true_vocab=200 "$e/exp-megatron-untied-1-2-local"
	legacy b22te tp=1,pp=2,megatron_spec=te,megatron_true_vocab=200 "$e/exp-megatron-gpt-bias-1-2-te"
	legacy b22te tp=2,pp=1 "$e/exp-megatron-gpt-bias-2-1-local"
	legacy u22v tp=2,pp=1,megatron_vp=2 "$e/exp-megatron-untied-2-1-local-vp2"
	legacy e21 tp=1,pp=2,megatron_true_vocab=200 "$e/exp-megatron-moe-1-2-local"
	legacy e22te tp=1,pp=1,megatron_ep=4,megatron_true_vocab=200 "$e/exp-megatron-moe-1-1-local-ep4"
	legacy e21 tp=2,pp=2,megatron_spec=te "$e/exp-megatron-moe-2-2-te"
	legacy g21te tp=1,pp=1,megatron_spec=te,megatron_ep=4,megatron_true_vocab=200 "$e/exp-megatron-moe-grouped-1-1-te-ep4"
}

@test "megatron-legacy: objects/ holds each rank file verbatim, optimizer and rng state included" {
	local f=$BATS_FILE_TMPDIR/u22v/ckpt/$ITER/mp_rank_01_001/model_optim_rng.pt
	mount_ff "$BATS_FILE_TMPDIR/u22v/ckpt" "$MNT" "tp=1"
	cmp "$MNT/objects/mp_rank_01_001.pt" "$f"
	run /usr/bin/python3 - "$MNT/objects/mp_rank_00_000.pt" "$MEG_STUB" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import torch
sd = torch.load(sys.argv[1])
print(list(sd))
assert "exp_avg" in sd["optimizer"]["optimizer"]["state"][0]
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"'model0', 'model1', 'optimizer', 'opt_param_scheduler', 'rng_state'"* ]]
	unmount_ff "$MNT"
}

@test "megatron-legacy: the save directory's tracker, megatron_iter=N, a tracker naming nothing" {
	local s=$BATS_TEST_TMPDIR/save
	mkdir -p "$s"
	cp -r "$BATS_FILE_TMPDIR/u21/ckpt/$ITER" "$s/$ITER"
	cp -r "$BATS_FILE_TMPDIR/t12/ckpt/$ITER" "$s/iter_0000200"
	printf '200\n' >"$s/latest_checkpointed_iteration.txt"
	mount_ff "$s" "$MNT" "tp=1,source_format=megatron-legacy"
	[ -e "$MNT/ranks/tp00_pp00" ]
	run cat "$MNT/index.json"
	[[ $output == *"iter_0000200"* ]]
	unmount_ff "$MNT"
	mount_ff "$s" "$MNT" "tp=2,pp=1,megatron_iter=100"
	megatron_legacy_run "$MNT" "$BATS_FILE_TMPDIR/u21/model-only"
	megatron_legacy_passed
	unmount_ff "$MNT"
	refused "$s" megatron_iter=300 "*iter_0000300*megatron_iter*no such iteration directory*"
	printf '300\n' >"$s/latest_checkpointed_iteration.txt"
	refused "$s" "" "*latest_checkpointed_iteration.txt*iter_0000300*not a directory*"
}

@test "megatron-legacy: a missing rank directory is named" {
	local d=$BATS_TEST_TMPDIR/miss
	cp -r "$BATS_FILE_TMPDIR/b22te/ckpt/$ITER" "$d"
	rm -r "$d/mp_rank_01_000"
	refused "$d" "" "*mp_rank_01_000*missing*2 x 2 (tp x pp) grid*"
}

@test "megatron-legacy: rank files that disagree on args are refused" {
	local d
	d=$(mutate u21 'sd = load("mp_rank_01"); sd["args"].num_layers = 8; save("mp_rank_01", sd)')
	refused "$d" "" "*mp_rank_01/model_optim_rng.pt*num_layers*8, but*mp_rank_00*says 4*"
}

@test "megatron-legacy: a replicated norm that differs between TP ranks is refused" {
	local d
	d=$(mutate u21 'sd = load("mp_rank_01"); k = "decoder.layers.1.input_layernorm.weight"; sd["model"][k] = sd["model"][k] + 1; save("mp_rank_01", sd)')
	refused "$d" "" "*mp_rank_01/model_optim_rng.pt*decoder.layers.1.input_layernorm.weight*replicated, but its bytes differ*"
}

@test "megatron-legacy: a shape that breaks the split rule, a storage past the end, a non-GPT key" {
	local d
	d=$(mutate u21 'sd = load("mp_rank_01"); k = "decoder.layers.0.mlp.linear_fc1.weight"; sd["model"][k] = sd["model"][k][:-2].clone(); save("mp_rank_01", sd)')
	refused "$d" "" "*decoder.layers.0.mlp.linear_fc1.weight*dtype or shape differs*"
	d=$(mutate u21 'sd = load("mp_rank_00"); sd["model"]["language_model.x"] = torch.zeros(2); save("mp_rank_00", sd)')
	refused "$d" "" "*mp_rank_00/model_optim_rng.pt*language_model.x*not a Megatron-Core GPT key*"
	d=$(mutate u21 'pass')
	truncate -s -4096 "$d/mp_rank_00/model_optim_rng.pt"
	refused "$d" "" "*mp_rank_00/model_optim_rng.pt*"
}

@test "megatron-legacy: args silent on SwiGLU: inferred from fc1's rows; silent on tying at pp 2: refused, naming the arg" {
	local d
	d=$(mutate u21 'for r in ("mp_rank_00", "mp_rank_01"):
    sd = load(r); del sd["args"].swiglu; save(r, sd)')
	# a wrong guess would put fc1's rows in another order
	views_changed u21 2 1 "$d"
	d=$(mutate t12 'for r in ("mp_rank_00_000", "mp_rank_00_001"):
    sd = load(r); del sd["args"].untie_embeddings_and_output_weights; save(r, sd)')
	refused "$d" "" "*args.untie_embeddings_and_output_weights*absent*"
}

@test "megatron-legacy: rank files in torch's pre-1.6 format mount the same" {
	local d
	d=$(mutate u22v 'import glob
for f in glob.glob(os.path.join(d, "*", "model_optim_rng.pt")):
    torch.save(torch.load(f), f, _use_new_zipfile_serialization=False)')
	run head -c 2 "$d/mp_rank_00_000/model_optim_rng.pt"
	[[ $output != PK ]]
	views_changed u22v 2 2 "$d"
	views_changed u22v 1 1 "$d"
}

@test "megatron-legacy: expert parallelism: refusals name the rank file, the key or the args field" {
	local d
	# the router is replicated on every tp and expert rank
	d=$(mutate e21 'sd = load("mp_rank_01_001"); k = "decoder.layers.1.mlp.router.weight"; sd["model"][k] = sd["model"][k] + 1; save("mp_rank_01_001", sd)')
	refused "$d" "" "*mp_rank_01_001/model_optim_rng.pt*decoder.layers.1.mlp.router.weight*replicated, but its bytes differ from mp_rank_00_000/model_optim_rng.pt*"
	# an expert rank short of one local expert
	d=$(mutate e21 'sd = load("mp_rank_00_001")
for k in [k for k in sd["model"] if ".local_experts.1." in k]:
    del sd["model"][k]
save("mp_rank_00_001", sd)')
	refused "$d" "" "*mlp.experts.local_experts.*missing in the rank files of tp rank 0*expert*"
	d=$(mutate e21 'for r in ("mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"):
    sd = load(r); sd["args"].num_experts = 8; save(r, sd)')
	refused "$d" "" "*mp_rank_00_000/model_optim_rng.pt*args.num_experts*8, but the files hold 4 (2 per rank x ep 2)*"
	d=$(mutate e21 'pass')
	rm -r "$d/mp_rank_01_001"
	refused "$d" "" "*mp_rank_01_001*missing*2 x 1 x 2 (tp x pp x ep) grid*"
	# args silent on the expert parallel size: mp_rank_TT_NNN reads as a
	# pipeline rank, which args.pipeline_model_parallel_size contradicts
	d=$(mutate e21 'for r in ("mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"):
    sd = load(r); del sd["args"].expert_model_parallel_size; save(r, sd)')
	refused "$d" "" "*args.pipeline_model_parallel_size*1, but the rank directories make pp 2*"
}

@test "megatron-legacy: expert parallelism, args silent on SwiGLU: inferred from the experts' fc1 rows" {
	local d
	d=$(mutate e21 'for r in ("mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"):
    sd = load(r); del sd["args"].swiglu; save(r, sd)')
	views_changed e21 2 1 "$d"
}
