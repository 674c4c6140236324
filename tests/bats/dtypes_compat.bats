#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Loader compatibility by default (docs/usage.md#dtypes-older-readers-cannot-hold):
# fixtures of every family holding complex64, complex128, uint16/32/64 and
# float8 tensors (DCP written by torch 2.6, torch.save zips of torch 2.6 and
# 1.13, Paddle, Hugging Face) are mounted, and every generated file is
# opened by the real loaders: torch 1.13 and numpy 1.24 (/usr/bin/python3),
# and, with the trixie chroot, safetensors 0.4.5, torch 2.6 and numpy 2.x.
# lib/check_dtypes.py holds the rule independently of flexfs (which
# dtypes each reader parses) and compares every tensor a file holds with
# the fixture's truth (sha256 of the bytes torch or the generator saved).
# The other families (Megatron, MindSpore, DeepSpeed, FSDP2) and megatron/:
# dtypes_compat_families.bats.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
CHECK=$FLEXFS_SRC/tests/bats/lib/check_dtypes.py

# fixture, its checkpoint directory, its truth file
FIXTURES=(
	"dcp-t26-dtypes ckpt truth/digest.txt"
	"dcp-t26 ckpt truth/manifest.json"
	"ts-t26-zip ckpt truth/manifest.json"
	"ts-t113-zip ckpt truth/manifest.json"
	"ts-t113-c128 ckpt truth/manifest.json"
	"hf-tiny single truth/manifest.json"
	"paddle-flex-p4 ckpt truth/manifest.json"
)

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check FIXTURE DIR TRUTH OPTS ARGS...: mount FIXTURE/DIR at tp=1 with
# OPTS, run check_dtypes.py with torch 1.13 and ARGS, unmount cleanly.
check() {
	local fx=$1 dir=$2 truth=$3 opts=$4

	shift 4
	mount_ff "$FX/$fx/$dir" "$MNT" "tp=1${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" --root "$MNT" --truth "$FX/$fx/$truth" "$@"
	echo "$fx ${opts:-(default)}: $output"
	unmount_ff "$MNT"
	[ "$status" -eq 0 ]
	[[ $output == *" checks ok, 0 failed" ]]
	[ "$FF_RC" -eq 0 ]
}

@test "by default every file opens in torch 1.13 and numpy 1.24, holding every tensor they can; one line names the rest" {
	local e fx dir truth
	for e in "${FIXTURES[@]}"; do
		read -r fx dir truth <<<"$e"
		check "$fx" "$dir" "$truth" ""
		# the mount said it once, one line, naming the option
		cat "$FF_ERR"
		[ "$(wc -l <"$FF_ERR")" -eq 1 ]
		grep -q "tensor(s) left out of the files whose readers cannot all hold their dtype" "$FF_ERR"
	done
	# what stays out, and why, per tensor
	mount_ff "$FX/dcp-t26-dtypes/ckpt" "$MNT" "tp=1"
	run /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1] + "/index.json"))["tensors"]
assert t["c64"]["left_out"] == {"safetensors": "safetensors before 0.7 (0.4.5) cannot read C64"}, t["c64"]
assert t["u16"]["left_out"] == {"torch.save": "torch 1.13 has no uint16 (torch >= 2.3 loads it)"}, t["u16"]
assert t["c128"]["left_out"] == {"safetensors": "safetensors has no complex128 dtype"}, t["c128"]
assert "left_out" not in t["mat"] and t["mat"]["in_safetensors"] is True
print("ok")' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	grep -q "9 tensor(s) left out.*c64 (complex64: not in safetensors).*new_dtypes=1" "$FF_ERR"
	unmount_ff "$MNT"
}

@test "by default the real safetensors 0.4.5, torch 2.6 and numpy 2.x open every file (trixie chroot)" {
	local e fx dir truth
	chroot_dir "$RULES"
	for e in "${FIXTURES[@]}"; do
		read -r fx dir truth <<<"$e"
		cp "$CHECK" "$FX/$fx/$truth" "$CHROOT$CHROOT_IN/"
		mount_ff "$FX/$fx/$dir" "$MNT" "tp=1"
		run chroot "$CHROOT" python3 "$CHROOT_IN/check_dtypes.py" \
			--root "$CHROOT_IN/mnt" --truth "$CHROOT_IN/$(basename "$truth")"
		echo "$fx (torch 2.6): $output"
		unmount_ff "$MNT"
		[ "$status" -eq 0 ]
		[[ $output == *" checks ok, 0 failed" ]]
	done
}

@test "new_dtypes=1 puts them back: complex64 in safetensors, uint16/32/64 and float8 in model.pt (torch 2.6)" {
	local e fx dir truth
	for e in "${FIXTURES[@]}"; do
		read -r fx dir truth <<<"$e"
		# the bytes by this script's reader (safetensors 0.4.5 refuses
		# C64: that is the point), npy by numpy, index.json
		check "$fx" "$dir" "$truth" "new_dtypes=1" --new --only safetensors --only npy --only index
		[ ! -s "$FF_ERR" ] || [ "$fx" = ts-t113-c128 ] || [ "$fx" = dcp-t26-dtypes ]
	done
	[[ -x $CHROOT/usr/bin/python3 ]] ||
		skip "no torch 2.6 chroot at $CHROOT for model.pt"
	chroot_dir "$RULES"
	for e in "${FIXTURES[@]}"; do
		read -r fx dir truth <<<"$e"
		cp "$CHECK" "$FX/$fx/$truth" "$CHROOT$CHROOT_IN/"
		mount_ff "$FX/$fx/$dir" "$MNT" "tp=1,new_dtypes=1"
		run chroot "$CHROOT" python3 "$CHROOT_IN/check_dtypes.py" --new --only pt \
			--root "$CHROOT_IN/mnt" --truth "$CHROOT_IN/$(basename "$truth")"
		echo "$fx new_dtypes=1 (torch 2.6): $output"
		unmount_ff "$MNT"
		[ "$status" -eq 0 ]
		[[ $output == *" checks ok, 0 failed" ]]
	done
}

@test "exclude_dtypes= leaves those dtypes out of every file, paddle/ and mindspore/ included" {
	check dcp-t26-dtypes ckpt truth/digest.txt "exclude_dtypes=complex64:F8_E4M3:U8" \
		--exclude complex64,float8_e4m3fn,uint8
	check paddle-flex-p4 ckpt truth/manifest.json "exclude_dtypes=C64:int8" \
		--exclude complex64,int8
	mount_ff "$FX/paddle-flex-p4/ckpt" "$MNT" "tp=1,exclude_dtypes=complex64"
	run /usr/bin/python3 -c '
import pickle, sys
d = pickle.load(open(sys.argv[1] + "/paddle/model_state.pdparams", "rb"))
assert "extra.c64" not in d and "extra.f64" in d, sorted(d)
print("ok")' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	mount_ff "$FX/dcp-t26/ckpt" "$MNT" "tp=1,mindspore,exclude_dtypes=float32"
	f=$MNT/mindspore/rank_0/checkpoint_0.ckpt
	[ -s "$f" ]
	grep -q "u16.weight" "$f"
	! grep -q "Float32" "$f"
	unmount_ff "$MNT"
}

@test "flexfs-inspect flags the tensors left out; a bad dtype name is refused in one line" {
	run "$FLEXFS_INSPECT" "$FX/dcp-t26-dtypes/ckpt"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"complex64 (not in safetensors) "* ]]
	[[ $output == *"uint16 (not in torch.save) "* ]]
	[[ $output == *"float8_e4m3fnuz (not in safetensors, torch.save) "* ]]
	run "$FLEXFS_INSPECT" -o new_dtypes=1 "$FX/dcp-t26-dtypes/ckpt"
	echo "$output"
	[[ $output == *"complex128 (not in safetensors) "* ]]
	[[ $output != *"complex64 (not"* && $output != *"uint16 (not"* ]]
	mount_refused_line "$FX/dcp-t26-dtypes/ckpt" "exclude_dtypes=complex64:cplx" \
		"*exclude_dtypes*'cplx' is no dtype*"
}
