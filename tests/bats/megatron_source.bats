#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# A Megatron save directory as the source (docs/formats/megatron.md#save-directory): the
# iteration latest_checkpointed_iteration.txt names, or -o megatron_iter=N,
# mounts; a "release" tracker serves megatron/release/ again.  And the
# source's args.vocab_size as the true vocab of megatron/ (docs/formats/megatron.md#vocabulary-padding).
# Oracle: tools/fixtures/gen_megatron.py legacy (numpy slices of the
# fixtures' truth), compared by tests/bats/lib/check_megatron_legacy.py.

load helpers
load megatron_helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron.py
ITER=iter_0000100

setup_file() {
	local d=$BATS_FILE_TMPDIR
	# a fixture whose args name the tokenizer's vocab (100 of the 256
	# saved rows); the oracle reads the same args
	cp -r "$FX/megatron-untied" "$d/megatron-vocab"
	/usr/bin/python3 - "$GEN" "$MEG_STUB" "$d/megatron-vocab" <<'PY'
import importlib.util, os, sys
sys.path.insert(0, sys.argv[2])
spec = importlib.util.spec_from_file_location("g", sys.argv[1])
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)
import torch
c = g.load_common(sys.argv[3])
c["args"].vocab_size = 100
torch.save(c, os.path.join(sys.argv[3], "ckpt", g.ITER_DIR, "common.pt"))
PY
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$FX" "$d" megatron-untied:2:2:local megatron-tied:1:2:local
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$d" "$d" megatron-vocab:1:2:local:100 \
		megatron-vocab:2:1:local:100 megatron-vocab:1:2:local:150
}

setup() {
	setup_ff
}

teardown() {
	megatron_teardown
	mountpoint -q "$MNT" && fusermount3 -u -z "$MNT"
	teardown_ff
}

# check MOUNT EXPECTED: the checker passes on MOUNT/megatron.
check() {
	megatron_legacy_run "$1" "$2"
	megatron_legacy_passed
}

# refused DIR OPTS WANT: the mount fails with one line containing WANT.
refused() {
	mount_refused_line "$1" "$2" "*$3*"
}

@test "megatron save dir: the tracker's iteration mounts, megatron/ equals Megatron's files" {
	mount_ff "$FX/megatron-untied/ckpt" "$MNT" "tp=2,pp=2"
	check "$MNT" "$BATS_FILE_TMPDIR/exp-megatron-untied-2-2-local"
	run cat "$MNT/index.json"
	[[ $output == *"megatron-untied/ckpt/$ITER"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron save dir: the tracker picks among iterations, megatron_iter=N another" {
	local s=$BATS_TEST_TMPDIR/save
	mkdir -p "$s"
	cp -r "$FX/megatron-untied/ckpt/$ITER" "$s/$ITER"
	cp -r "$FX/megatron-tied/ckpt/$ITER" "$s/iter_0000200"
	printf '200\n' >"$s/latest_checkpointed_iteration.txt"
	megatron_legacy "$s|tp=1,pp=2,megatron_true_vocab=200|$BATS_FILE_TMPDIR/exp-megatron-tied-1-2-local" \
		"$s|tp=2,pp=2,megatron_iter=100|$BATS_FILE_TMPDIR/exp-megatron-untied-2-2-local"
	refused "$s" megatron_iter=300 \
		"save/iter_0000300: megatron_iter: no such iteration directory"
	refused "$s" megatron_iter=x "megatron_iter"
}

@test "megatron save dir: a 'release' tracker serves megatron/release/ and 'release'" {
	local s=$BATS_TEST_TMPDIR/save m2=$BATS_TEST_TMPDIR/m2 f
	mkdir -p "$s" "$m2"
	cp -r "$FX/megatron-untied/ckpt/$ITER" "$s/release"
	printf 'release' >"$s/latest_checkpointed_iteration.txt"
	mount_ff "$s" "$MNT" "tp=2,pp=2"
	run ls "$MNT/megatron"
	[ "$output" = $'latest_checkpointed_iteration.txt\nrelease' ]
	[ "$(cat "$MNT/megatron/latest_checkpointed_iteration.txt")" = release ]
	# the same files as the iteration's own mount
	local pid=$FF_PID
	mount_ff "$FX/megatron-untied/ckpt/$ITER" "$m2" "tp=2,pp=2"
	for f in mp_rank_00_000 mp_rank_01_001; do
		cmp "$MNT/megatron/release/$f/model_optim_rng.pt" \
			"$m2/megatron/$ITER/$f/model_optim_rng.pt"
	done
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
}

@test "megatron: the iteration's other entries (integrity.json, tokenizer/, modelopt_state/) leave every view as it was" {
	# docs/formats/megatron.md#iteration-directory: written beside the DCP files by newer versions and options
	local d=$BATS_TEST_TMPDIR/extras
	cp -r "$FX/megatron-untied/ckpt/$ITER" "$d"
	mkdir -p "$d/tokenizer" "$d/modelopt_state"
	printf '{"files": {}}' >"$d/integrity.json"
	printf '{}' >"$d/tokenizer/tokenizer_config.json"
	printf 'x' >"$d/modelopt_state/__0_0.distcp"
	megatron_views "$FX/megatron-untied" "$d" 2 2
}

@test "megatron: a checkpoint of iteration 0 serves megatron/release/, the tracker 'release'" {
	# Megatron's read_metadata() asserts "iteration > 0 or release": a
	# tracker saying 0 would stop its loader
	local d=$BATS_TEST_TMPDIR/it0
	copy_common "$FX/megatron-untied/ckpt/$ITER" "$d" 'c["iteration"] = 0'
	mount_ff "$d" "$MNT" "tp=2,pp=2"
	run ls "$MNT/megatron"
	[ "$output" = $'latest_checkpointed_iteration.txt\nrelease' ]
	run /usr/bin/python3 -c '
import sys
s = open(sys.argv[1]).read().strip()
try:
    it, rel = int(s), False
except ValueError:
    it, rel = 0, s == "release"
assert it > 0 or rel, s          # Megatron read_metadata()
print(s)' "$MNT/megatron/latest_checkpointed_iteration.txt"
	[ "$status" -eq 0 ] && [ "$output" = release ]
	PYTHONPATH=$MEG_STUB /usr/bin/python3 -c '
import sys, torch
sd = torch.load(sys.argv[1], map_location="cpu")
assert sd["iteration"] == 0 and sd["checkpoint_version"] == 3.0, sd.keys()' \
		"$MNT/megatron/release/mp_rank_01_001/model_optim_rng.pt"
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron save dir: a bad tracker or a missing iteration is refused with one line" {
	local s=$BATS_TEST_TMPDIR/save
	mkdir -p "$s"
	cp -r "$FX/megatron-untied/ckpt/$ITER" "$s/$ITER"
	printf 'latest' >"$s/latest_checkpointed_iteration.txt"
	refused "$s" "" "latest_checkpointed_iteration.txt: 'latest' is neither an iteration number nor 'release'"
	printf '200' >"$s/latest_checkpointed_iteration.txt"
	refused "$s" "" "latest_checkpointed_iteration.txt: names iter_0000200, which is not a directory here"
	# a symlinked iteration directory is not followed
	ln -s "$ITER" "$s/iter_0000200"
	printf '200' >"$s/latest_checkpointed_iteration.txt"
	refused "$s" "" "names iter_0000200, which is not a directory here"
}

@test "megatron: args.vocab_size is the true vocab of megatron/; megatron_true_vocab overrides it" {
	local src=$BATS_FILE_TMPDIR/megatron-vocab/ckpt e=$BATS_FILE_TMPDIR/exp-megatron-vocab
	megatron_legacy "$src|tp=1,pp=2|$e-1-2-local-100" \
		"$src|tp=2,pp=1|$e-2-1-local-100" \
		"$src|tp=1,pp=2,megatron_true_vocab=150|$e-1-2-local-150"
}

@test "megatron <= 0.7: plain Metadata, no content_metadata, fully_sharded_bucket_space 1-D buckets served as saved" {
	# tests/unit/data/megatron-v07: tools/fixtures/gen_megatron_v07.py's
	# overlay on megatron-optim-dp-reshardable (the same tensors and bytes)
	local d=$BATS_TEST_TMPDIR/v07 fx=megatron-optim-dp-reshardable tp
	cp -r "$FX/$fx/ckpt/$ITER" "$d"
	cp -a "$FLEXFS_SRC/tests/unit/data/megatron-v07/." "$d/"
	for tp in 1 2; do
		megatron_views "$FX/$fx" "$d" "$tp"
	done
	run "$FLEXFS_INSPECT" "$d"
	echo "$output"
	[[ $output == *"fully_sharded_bucket_space"* ]]
}
