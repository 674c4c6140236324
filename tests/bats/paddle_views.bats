#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The paddle/ tree of a Paddle checkpoint: PaddleNLP's per-rank
# model_state[.tpXX][_ppYY].pdparams and optimizer[...].pdopt.  Each
# tests/fixtures/paddle-* fixture is mounted at tp 1, 2, 4 x pp 1, 2 (the
# large grids where the forms differ: bf16 weights and the dtype zoo, fp32
# master weights with flattened states, pure fp32 optimizer states) and
# lib/check_paddle_files.py compares every file, loaded with pickle.load,
# with what tools/fixtures/gen_paddle.py pdparams (a paddle.save stand-in
# built from the fixture's truth, nothing of flexfs) writes for the same
# target: the same file names, dicts, keys in order, Paddle names,
# (name, ndarray) tuples, dtypes, shapes and bytes.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_paddle.py
CHECK=$FLEXFS_SRC/tests/bats/lib/check_paddle_files.py

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check_files FIXTURE DIR TP PP [OPTS] [ORACLE ARGS...]: mount DIR at
# tp/pp, compare paddle/ with the oracle's files for fixture FIXTURE,
# unmount cleanly; the daemon said nothing.
check_files() {
	local fx=$1 dir=$2 tp=$3 pp=$4 opts=${5:-}
	local exp=$BATS_TEST_TMPDIR/exp-$fx-$tp-$pp

	shift 5 || shift $#
	rm -rf "$exp"
	/usr/bin/python3 "$GEN" pdparams --src "$FX/$fx" --tp "$tp" --pp "$pp" \
		--out "$exp" "$@" >/dev/null
	mount_ff "$dir" "$MNT" "tp=$tp,pp=$pp${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" "$MNT/paddle" "$exp"
	echo "$fx tp=$tp pp=$pp $opts $*: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" files equal" ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

@test "paddle/ of paddle-flex-p4 (bf16, dtype zoo, uneven splits) at tp 1,2,4 x pp 1,2, and p5" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_files paddle-flex-p4 "$FX/paddle-flex-p4/ckpt" "$tp" "$pp"
		done
	done
	check_files paddle-flex-p5 "$FX/paddle-flex-p5/ckpt" 2 2
}

@test "paddle/ of paddle-flex-np2-sharding (master weights: tuple form) at tp 1,2,4 x pp 1,2" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_files paddle-flex-np2-sharding \
				"$FX/paddle-flex-np2-sharding/ckpt" "$tp" "$pp"
		done
	done
}

@test "paddle/ of PaddleFormers checkpoint-5 (pure fp32: state dict form) at tp 1,2,4 x pp 1,2, and of one part" {
	local d=$FX/paddle-formers-np2-p4/ckpt/checkpoint-5

	for tp in 1 2 4; do
		for pp in 1 2; do
			check_files paddle-formers-np2-p4 "$d" "$tp" "$pp"
		done
	done
	check_files paddle-formers-np2-p4 "$d/optimizer_state" 2 2 "" \
		--part optimizer_state
	# bf16 training: master_weight/ joins the optimizer file (tuple form)
	check_files paddle-formers-master-p3 \
		"$FX/paddle-formers-master-p3/ckpt/checkpoint-5" 2 1
}

@test "paddle/ of several ids: the one mounted (protocol 2 and 4, fp32 and bf16)" {
	local d=$FX/paddle-multi-id/ckpt

	check_files paddle-multi-id "$d" 2 2
	check_files paddle-multi-id "$d" 2 2 paddle_id=0 --id 0
	check_files paddle-multi-id "$d" 4 1 paddle_id=1 --id 1
	check_files paddle-multi-id "$d" 1 1 paddle_id=3 --id 3
}

@test "paddle/ of arrays saved in pieces (UnpackBigParamInfor@@, protocol 3 and 2)" {
	local d=$FX/paddle-flex-pieces/ckpt

	check_files paddle-flex-pieces "$d" 2 1
	check_files paddle-flex-pieces "$d" 4 1 paddle_id=0 --id 0
}

@test "paddle/ only for a Paddle checkpoint" {
	mount_ff "$FIXTURE" "$MNT"
	[ ! -e "$MNT/paddle" ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}
