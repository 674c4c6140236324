#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# args.make_vocab_size_divisible_by absent from common.pt (a minimal args):
# megatron/ re-pads the vocab tables to a multiple of it x tp, so without it
# only a target at the saving run's tp (2 here, args.vocab_size unknown) is
# certain (the saved rows); any other gets megatron/unavailable.txt naming
# the arg and -o megatron_vocab_divisible_by=, never a guessed 128.  A value
# stated that contradicts the args is refused too (docs/facts.md).
# The tokenizer's vocab (args.vocab_size, usually absent) likewise: the saved
# rows bound it, and a target whose padding differs within that bound gets
# megatron/unavailable.txt naming -o megatron_true_vocab=; stated, the files
# equal tools/fixtures/gen_megatron.py legacy --true-vocab's.
# Oracle: megatron/ of the same fixture with its full args, whose files
# megatron_legacy.bats checks against Megatron's own layout
# (tools/fixtures/gen_megatron.py legacy): the tensors must be equal.

load helpers
load megatron_helpers

FX=$FLEXFS_SRC/tests/fixtures
ITER=iter_0000100

setup() {
	setup_ff
}

teardown() {
	megatron_teardown
	teardown_ff
}

# same_model MNT_A MNT_B TP: every rank's model tensors of megatron/ equal
# in both mounts (pp 1), and args.padded_vocab_size
same_model() {
	run env PYTHONPATH="$MEG_STUB" /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import sys, torch
a_root, b_root, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
n = 0
for t in range(tp):
    f = "/megatron/iter_0000100/mp_rank_%02d/model_optim_rng.pt" % t
    a = torch.load(a_root + f, map_location="cpu")
    b = torch.load(b_root + f, map_location="cpu")
    assert a["args"].padded_vocab_size == b["args"].padded_vocab_size
    a, b = a["model"], b["model"]
    assert list(a) == list(b), (t, list(a), list(b))
    for k, v in a.items():
        if v is None or not torch.is_tensor(v):
            continue
        assert torch.equal(v, b[k]), (t, k)
        n += 1
print("ok", n)
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok "* ]]
}

# both D TP OPTS [FULL_OPTS]: megatron/ of D at tp=TP with OPTS equals the
# full fixture's at tp=TP with FULL_OPTS
both() {
	local m2=$BATS_TEST_TMPDIR/full
	mkdir -p "$m2"
	mount_ff "$1" "$MNT" "tp=$2${3:+,$3}"
	local pid=$FF_PID
	mount_ff "$FX/megatron-untied/ckpt/$ITER" "$m2" "tp=$2${4:+,$4}"
	same_model "$MNT" "$m2" "$2"
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
}

@test "megatron: args without make_vocab_size_divisible_by: the saving tp keeps the saved rows; another tp is refused naming megatron_vocab_divisible_by, which states it" {
	local d=$BATS_TEST_TMPDIR/nodiv
	copy_common "$FX/megatron-untied/ckpt/$ITER" "$d" \
		'del c["args"].make_vocab_size_divisible_by'
	! grep -q make_vocab_size_divisible_by "$d/common.pt"
	both "$d" 2
	mount_ff "$d" "$MNT" "tp=4"
	megatron_unavailable "*args.make_vocab_size_divisible_by: megatron/: absent from common.pt, and the vocab padding at tp=4 depends on it: state it with -o megatron_vocab_divisible_by=M*"
	[ -f "$MNT/index.json" ]
	unmount_ff "$MNT"
	both "$d" 4 megatron_vocab_divisible_by=128
	# tp 1 from the saving tp 2 depends on the true vocab too (200)
	both "$d" 1 megatron_vocab_divisible_by=128,megatron_true_vocab=200 \
		megatron_true_vocab=200
	# a true vocab needs the multiple too, even at the saving tp
	mount_ff "$d" "$MNT" "tp=2,megatron_true_vocab=100"
	megatron_unavailable "*args.make_vocab_size_divisible_by*megatron_vocab_divisible_by=M*"
	unmount_ff "$MNT"
}

@test "megatron: megatron_vocab_divisible_by that contradicts args.make_vocab_size_divisible_by is refused" {
	mount_ff "$FX/megatron-untied/ckpt/$ITER" "$MNT" "tp=2,megatron_vocab_divisible_by=64"
	megatron_unavailable "*megatron_vocab_divisible_by: megatron/: 64 contradicts args.make_vocab_size_divisible_by 128*"
	unmount_ff "$MNT"
	both "$FX/megatron-untied/ckpt/$ITER" 4 megatron_vocab_divisible_by=128
}

# same_moe MNT_A MNT_B: megatron/ of tp=2,pp=1 mounts, every rank's model
# keys and tensors equal
same_moe() {
	run env PYTHONPATH="$MEG_STUB" /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, torch
n = 0
for t in range(2):
    f = "/megatron/iter_0000100/mp_rank_%02d/model_optim_rng.pt" % t
    a = torch.load(sys.argv[1] + f, map_location="cpu")["model"]
    b = torch.load(sys.argv[2] + f, map_location="cpu")["model"]
    assert list(a) == list(b), (t, list(a), list(b))
    assert any(".local_experts." in k for k in a), list(a)
    for k, v in a.items():
        if torch.is_tensor(v):
            assert torch.equal(v, b[k]), (t, k)
            n += 1
print("ok", n)
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok "* ]]
}

@test "megatron: megatron_spec=te, MoE, args without moe_grouped_gemm: refused naming megatron_grouped_gemm, which states it; contradicting the args: refused" {
	local src=$FX/megatron-moe/ckpt/$ITER d=$BATS_TEST_TMPDIR/nogg m2=$BATS_TEST_TMPDIR/full
	copy_common "$src" "$d" 'del c["args"].moe_grouped_gemm'
	mount_ff "$d" "$MNT" "tp=2,pp=1,megatron_spec=te"
	megatron_unavailable "*args.moe_grouped_gemm: megatron/: absent from common.pt, and the experts' te names depend on it: state it with -o megatron_grouped_gemm=on|off*"
	unmount_ff "$MNT"
	# the local spec does not depend on it
	mount_ff "$d" "$MNT" "tp=2,pp=1"
	[ -f "$MNT/megatron/latest_checkpointed_iteration.txt" ]
	unmount_ff "$MNT"
	mkdir -p "$m2"
	mount_ff "$d" "$MNT" "tp=2,pp=1,megatron_spec=te,megatron_grouped_gemm=off"
	local pid=$FF_PID
	mount_ff "$src" "$m2" "tp=2,pp=1,megatron_spec=te"
	same_moe "$MNT" "$m2"
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
	mount_ff "$src" "$MNT" "tp=2,pp=1,megatron_spec=te,megatron_grouped_gemm=on"
	megatron_unavailable "*megatron_grouped_gemm: megatron/: 'on' contradicts args.moe_grouped_gemm (False)*"
	unmount_ff "$MNT"
}

@test "megatron: the tokenizer's vocab absent: a multiple of the saving tp keeps one padding; tp 1 from tp 2 is refused naming megatron_true_vocab, which states it (bytes equal Megatron's layout)" {
	# docs/formats/megatron.md#vocabulary-padding: vocab 40 padded to 64 at
	# tp 2 (m 16); a vocab in (32, 64] pads to 48 or 64 at tp 1
	local src=$FX/megatron-te-fp8/ckpt/$ITER d=$BATS_TEST_TMPDIR/v40 o=$BATS_TEST_TMPDIR/exp
	local args
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$FLEXFS_SRC/tools/fixtures/gen_megatron.py" "$FX" "$o" \
		megatron-te-fp8:1:1:local:40 megatron-te-fp8:2:1:local
	# the oracle at tp 1 pads the true vocab 40 to 48 rows, not the saved 64
	run env PYTHONPATH="$MEG_STUB" /usr/bin/python3 -c '
import sys, torch
a = torch.load(sys.argv[1] + "/iter_0000100/mp_rank_00/model_optim_rng.pt", map_location="cpu")
print(a["args"].padded_vocab_size, a["model"]["embedding.word_embeddings.weight"].shape[0])' \
		"$o/exp-megatron-te-fp8-1-1-local-40"
	echo "$output"
	[ "$output" = "48 48" ]
	mount_ff "$src" "$MNT" "tp=1,pp=1"
	megatron_unavailable "*args.vocab_size: megatron/: absent, and the padded rows at tp=1 depend on it (48 or 64 for a vocab in (32, 64]): state it with -o megatron_true_vocab=V*"
	[ -f "$MNT/index.json" ]
	unmount_ff "$MNT"
	# args without the saving tp: the word embedding's two row chunks give it
	copy_common "$src" "$BATS_TEST_TMPDIR/notp" \
		'del c["args"].tensor_model_parallel_size'
	mount_ff "$BATS_TEST_TMPDIR/notp" "$MNT" "tp=1,pp=1"
	megatron_unavailable "*args.vocab_size: megatron/: absent, and the padded rows at tp=1 depend on it (48 or 64 for a vocab in (32, 64])*"
	unmount_ff "$MNT"
	# a multiple the saved rows are not a padding by: no bound, refused
	copy_common "$src" "$BATS_TEST_TMPDIR/nodiv" \
		'del c["args"].make_vocab_size_divisible_by'
	mount_ff "$BATS_TEST_TMPDIR/nodiv" "$MNT" "tp=1,pp=1,megatron_vocab_divisible_by=24"
	megatron_unavailable "*args.vocab_size: megatron/: absent, and the saved 64 rows of embedding.word_embeddings.weight are not a multiple of make_vocab_size_divisible_by 24 x the saving tp 2: state the vocab with -o megatron_true_vocab=V*"
	unmount_ff "$MNT"
	# stated by the option; the saving tp needs none
	args=("$src|tp=1,pp=1,megatron_true_vocab=40|$o/exp-megatron-te-fp8-1-1-local-40"
		"$src|tp=2,pp=1|$o/exp-megatron-te-fp8-2-1-local")
	megatron_legacy "${args[@]}"
	# or by args.vocab_size: the same tensors as with the option
	copy_common "$src" "$d" 'c["args"].vocab_size = 40'
	mkdir -p "$BATS_TEST_TMPDIR/m2"
	mount_ff "$d" "$MNT" "tp=1,pp=1"
	local pid=$FF_PID
	mount_ff "$src" "$BATS_TEST_TMPDIR/m2" "tp=1,pp=1,megatron_true_vocab=40"
	same_model "$MNT" "$BATS_TEST_TMPDIR/m2" 1
	unmount_ff "$BATS_TEST_TMPDIR/m2"
	FF_PID=$pid
	unmount_ff "$MNT"
}
