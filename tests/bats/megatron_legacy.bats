#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# megatron/: the legacy per-rank files (megatron-format.md 6-8) served from
# the tests/fixtures/megatron-* torch_dist fixtures, torch.load-ed and
# compared key by key (tensors bitwise, args, iteration, version) with the
# files tools/fixtures/gen_megatron.py legacy writes for the same target
# (numpy slices of the truth, saved by torch.save): lib/check_megatron_legacy.py.
# torch 1.13 for tp 1/2/4 x pp 1/2 and both specs; torch 2.6 (trixie chroot,
# when present) with weights_only=True and mmap=True.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
GEN=$FLEXFS_SRC/tools/fixtures/gen_megatron.py
CHECK=$FLEXFS_SRC/tests/bats/lib/check_megatron_legacy.py
STUB=$FLEXFS_SRC/tools/fixtures/megatron_stub
CHROOT=${FLEXFS_TORCH2_CHROOT:-/opt/trixie}
ITER=ckpt/iter_0000100

setup_file() {
	local t=() fx tp pp
	for fx in megatron-untied megatron-tied megatron-moe; do
		for tp in 1 2 4; do
			for pp in 1 2; do
				t+=("$fx:$tp:$pp:local")
			done
		done
		t+=("$fx:2:2:te")
	done
	t+=("megatron-untied:4:1:te")
	/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/megatron_oracles.py" \
		"$GEN" "$FX" "$BATS_FILE_TMPDIR" "${t[@]}"
}

setup() {
	setup_ff
	MDIRS=()
}

teardown() {
	local d
	for d in "${MDIRS[@]}"; do
		mountpoint -q "$d" && fusermount3 -u -z "$d"
	done
	teardown_ff
}

# check_legacy FIXTURE SPEC TPxPP...: mount the fixture at every target at
# once, compare each megatron/ with its oracle in one checker run, unmount
# cleanly; no daemon said anything.
check_legacy() {
	local fx=$1 spec=$2 tgt tp pp d i args=() pids=() errs=()
	shift 2
	for tgt in "$@"; do
		tp=${tgt%x*} pp=${tgt#*x}
		d=$BATS_TEST_TMPDIR/m-$fx-$tp-$pp-$spec
		mkdir -p "$d"
		mount_ff "$FX/$fx/$ITER" "$d" "tp=$tp,pp=$pp,megatron_spec=$spec"
		MDIRS+=("$d")
		pids+=("$FF_PID")
		errs+=("$FF_ERR")
		args+=(--mount "$d/megatron" --expected
			"$BATS_FILE_TMPDIR/exp-$fx-$tp-$pp-$spec")
	done
	run /usr/bin/python3 "$CHECK" "${args[@]}" --stub "$STUB"
	echo "$fx $spec $*: $output"
	for i in "${!pids[@]}"; do
		FF_PID=${pids[$i]}
		unmount_ff "${MDIRS[$i]}"
		[ "$FF_RC" -eq 0 ]
		[ ! -s "${errs[$i]}" ]
	done
	FF_PID=
	MDIRS=()
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
}

@test "megatron/ legacy files equal Megatron's at tp 1,2,4 x pp 1,2 (untied, tied, moe; local spec)" {
	for fx in megatron-untied megatron-tied megatron-moe; do
		check_legacy "$fx" local 1x1 1x2 2x1 2x2 4x1 4x2
	done
}

@test "megatron/ legacy files with megatron_spec=te (fused norms, TE extra states)" {
	for fx in megatron-untied megatron-tied megatron-moe; do
		check_legacy "$fx" te 2x2
	done
	check_legacy megatron-untied te 4x1
}

@test "megatron/ legacy files load in torch 2.6 (trixie chroot), weights_only and mmap" {
	[[ -x $CHROOT/usr/bin/python3 ]] ||
		skip "no torch 2.6 chroot at $CHROOT (tools/fixtures/README.md)"
	local inner=/tmp/flexfs-bats-mlg-$$ fx tp pp exp
	mkdir -p "$CHROOT$inner/mnt"
	cp "$CHECK" "$CHROOT$inner/"
	cp -r "$STUB" "$CHROOT$inner/stub"
	MNT=$CHROOT$inner/mnt
	for fx in megatron-untied megatron-tied megatron-moe; do
		for tp in 1 4; do
			pp=$((tp == 1 ? 2 : 1))
			exp=$BATS_FILE_TMPDIR/exp-$fx-$tp-$pp-local
			rm -rf "$CHROOT$inner/exp"
			cp -r "$exp" "$CHROOT$inner/exp"
			mount_ff "$FX/$fx/$ITER" "$MNT" "tp=$tp,pp=$pp"
			run chroot "$CHROOT" python3 "$inner/check_megatron_legacy.py" \
				--mount "$inner/mnt/megatron" --expected "$inner/exp" \
				--stub "$inner/stub" --weights-only --mmap
			echo "$fx tp=$tp pp=$pp: $output"
			unmount_ff "$MNT"
			[ "$status" -eq 0 ] || break 2
			[[ $output == *" passed, 0 failed"* ]] || break 2
		done
	done
	rm -rf "${CHROOT:?}$inner"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
}

@test "megatron/: a target the legacy format cannot express says why in unavailable.txt" {
	mount_ff "$FX/megatron-untied/$ITER" "$MNT" "tp=2,pp=3"
	run ls "$MNT/megatron"
	echo "$output"
	[ "$output" = "unavailable.txt" ]
	run cat "$MNT/megatron/unavailable.txt"
	echo "$output"
	[[ $output == *"num_layers: megatron/: 4 layers do not divide into pp=3 stages"* ]]
	[ -d "$MNT/ranks/tp01_pp02" ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "megatron/ is absent for a source that is not Megatron; megatron_spec=bad is refused" {
	mount_ff "$FX/dcp-t113/ckpt" "$MNT" "tp=1"
	[ ! -e "$MNT/megatron" ]
	unmount_ff "$MNT"
	run --separate-stderr "$FLEXFS_BIN" "$FX/megatron-untied/$ITER" "$MNT" \
		-o megatron_spec=bad 3>&-
	echo "$stderr"
	[ "$status" -ne 0 ]
	not_mounted "$MNT"
	[ "$(printf '%s\n' "$stderr" | wc -l)" -eq 1 ]
	[[ $stderr == *"megatron_spec"*"expected local or te, got 'bad'"* ]]
}
