#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# args.swiglu absent from common.pt (a minimal args): whether fc1 is SwiGLU
# decides how megatron/ splits linear_fc1, so flexfs takes it from the
# saved chunks where they show it (each TP rank of a SwiGLU fc1 saved its W
# and V row ranges, one in each half, as two chunks of one file; a plain
# fc1's ranges are contiguous, rows / tp each), and otherwise serves
# megatron/ as unavailable.txt naming args.swiglu, never a guessed split.
# Oracle: the same fixture with its full args (tools/fixtures/
# gen_megatron.py; megatron/ of those is checked against Megatron's own
# layout by megatron_legacy.bats): megatron/'s tensors must be equal.

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

# same_model MNT_A MNT_B TP PP: every rank's model tensors of megatron/
# equal in both mounts
same_model() {
	run env PYTHONPATH="$MEG_STUB" /usr/bin/python3 - "$1" "$2" "$3" "$4" <<'PY'
import sys, torch
a_root, b_root, tp, pp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = 0
for t in range(tp):
    for p in range(pp):
        d = "mp_rank_%02d" % t + ("_%03d" % p if pp > 1 else "")
        f = "/megatron/iter_0000100/%s/model_optim_rng.pt" % d
        a = torch.load(a_root + f, map_location="cpu")["model"]
        b = torch.load(b_root + f, map_location="cpu")["model"]
        assert list(a) == list(b), (d, list(a), list(b))
        for k, v in a.items():
            if v is None or not torch.is_tensor(v):
                continue
            assert torch.equal(v, b[k]), (d, k)
            n += 1
print("ok", n)
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok "* ]]
}

@test "megatron: args without swiglu: a SwiGLU fc1 is known by its chunks (W and V of each rank), megatron/ splits it as Megatron does" {
	local d=$BATS_TEST_TMPDIR/noswiglu m2=$BATS_TEST_TMPDIR/full
	copy_common "$FX/megatron-untied/ckpt/$ITER" "$d" \
		'del c["args"].swiglu; del c["args"].tensor_model_parallel_size'
	grep -q swiglu "$FX/megatron-untied/ckpt/$ITER/common.pt"
	! grep -q swiglu "$d/common.pt"
	mkdir -p "$m2"
	# tp 1 from the saving tp 2: the vocab padding depends on the true vocab
	# (200), stated; tp 2 and 4 need none, the saving tp coming from the
	# word embedding's chunks here
	for tp in 1 2 4; do
		local v=
		((tp != 1)) || v=,megatron_true_vocab=200
		mount_ff "$d" "$MNT" "tp=$tp,pp=2$v"
		local pid=$FF_PID
		mount_ff "$FX/megatron-untied/ckpt/$ITER" "$m2" "tp=$tp,pp=2$v"
		same_model "$MNT" "$m2" "$tp" 2
		unmount_ff "$m2"
		FF_PID=$pid
		unmount_ff "$MNT"
	done
}

@test "megatron: args without swiglu, with biases (pretrain_gpt defaults): SwiGLU known by its chunks; a zarr checkpoint (chunks of its own grid) gets megatron/unavailable.txt naming args.swiglu" {
	local d=$BATS_TEST_TMPDIR/bias z=$BATS_TEST_TMPDIR/zarr m2=$BATS_TEST_TMPDIR/full
	copy_common "$FX/megatron-gpt-bias/ckpt/$ITER" "$d" 'del c["args"].swiglu'
	mkdir -p "$m2"
	mount_ff "$d" "$MNT" "tp=4"
	local pid=$FF_PID
	mount_ff "$FX/megatron-gpt-bias/ckpt/$ITER" "$m2" "tp=4"
	same_model "$MNT" "$m2" 4 1
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
	# nothing tells: refused for megatron/ only, the rest served
	copy_common "$FX/megatron-zarr/ckpt/$ITER" "$z" 'del c["args"].swiglu'
	mount_ff "$z" "$MNT" "tp=2"
	megatron_unavailable "*args.swiglu: megatron/: absent from common.pt, and the saved chunks of decoder.layers.mlp.linear_fc1.weight do not show whether fc1 is SwiGLU*"
	[ -f "$MNT/index.json" ]
	unmount_ff "$MNT"
}

# same_tree A B DIR: every file under A/DIR and B/DIR, byte for byte
same_tree() {
	run diff -r "$1/$3" "$2/$3"
	echo "$output"
	[ "$status" -eq 0 ]
	run find "$1/$3" -type f
	[ -n "$output" ]
}

@test "megatron: args without swiglu, chunks that do not show it (zarr): -o megatron_swiglu=on states it; megatron/ and rules=@megatron-gpt's ranks/ as with args.swiglu; without it the preset is refused naming the option" {
	local z=$BATS_TEST_TMPDIR/zarr m2=$BATS_TEST_TMPDIR/full
	local full=$FX/megatron-zarr/ckpt/$ITER
	copy_common "$full" "$z" 'del c["args"].swiglu'
	mkdir -p "$m2"
	# the preset's fc1 rule depends on it: refused, not taken as GELU
	mount_refused_line "$z" "tp=2,rules=@megatron-gpt" \
		"*swiglu*when*absent from the args*-o megatron_swiglu=on|off*"
	run "$FLEXFS_INSPECT" "$z" -o megatron_swiglu=on
	[ "$status" -eq 0 ]
	[[ $output == *"(SwiGLU, from -o megatron_swiglu)"* ]]
	mount_ff "$z" "$MNT" "tp=2,pp=2,megatron_swiglu=on,rules=@megatron-gpt"
	local pid=$FF_PID
	mount_ff "$full" "$m2" "tp=2,pp=2,rules=@megatron-gpt"
	same_model "$MNT" "$m2" 2 2
	same_tree "$MNT" "$m2" ranks
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
	# off: fc1 split as a plain column-parallel linear, which differs
	mount_ff "$z" "$MNT" "tp=2,megatron_swiglu=off,rules=@megatron-gpt"
	pid=$FF_PID
	mount_ff "$full" "$m2" "tp=2,rules=@megatron-gpt"
	run cmp "$MNT/ranks/tp00/model.safetensors" "$m2/ranks/tp00/model.safetensors"
	[ "$status" -ne 0 ]
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
}

@test "megatron: -o megatron_swiglu= that contradicts args.swiglu or fc1's saved chunks is refused at mount" {
	local d=$BATS_TEST_TMPDIR/noswiglu
	mount_refused_line "$FX/megatron-untied/ckpt/$ITER" "megatron_swiglu=off" \
		"*megatron_swiglu*'off' contradicts args.swiglu of the common state (SwiGLU)*"
	copy_common "$FX/megatron-untied/ckpt/$ITER" "$d" 'del c["args"].swiglu'
	mount_refused_line "$d" "megatron_swiglu=off" \
		"*megatron_swiglu*'off' contradicts what linear_fc1's saved chunks show (SwiGLU)*"
	run "$FLEXFS_INSPECT" "$d"
	[ "$status" -eq 0 ]
	[[ $output == *"(SwiGLU, from fc1's saved chunks)"* ]]
	# agreeing is fine
	mount_ff "$d" "$MNT" "megatron_swiglu=on"
	[ -f "$MNT/index.json" ]
	unmount_ff "$MNT"
}

@test "megatron-legacy source: args without swiglu or ffn_hidden_size: refused naming megatron_swiglu; stated, hf/ as with the args; contradicting the args: refused" {
	local src=$FX/megatron-legacy-tp2pp2/ckpt/$ITER d=$BATS_TEST_TMPDIR/legacy
	local m2=$BATS_TEST_TMPDIR/full
	mount_refused_line "$src" "megatron_swiglu=off" \
		"*megatron_swiglu*'off' contradicts args.swiglu*"
	cp -r "$src" "$d"
	PYTHONPATH=$MEG_STUB /usr/bin/python3 -c '
import glob, sys, torch
for f in glob.glob(sys.argv[1] + "/*/model_optim_rng.pt"):
    sd = torch.load(f, map_location="cpu")
    del sd["args"].swiglu
    del sd["args"].ffn_hidden_size
    torch.save(sd, f)' "$d"
	mount_refused_line "$d" "" \
		"*args.swiglu*absent*do not tell*-o megatron_swiglu=on|off*"
	mkdir -p "$m2"
	mount_ff "$d" "$MNT" "megatron_swiglu=on"
	local pid=$FF_PID
	mount_ff "$src" "$m2" ""
	same_tree "$MNT" "$m2" hf
	unmount_ff "$m2"
	FF_PID=$pid
	unmount_ff "$MNT"
}
