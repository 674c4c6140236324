#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Loader compatibility (docs/usage.md#dtypes-older-readers-cannot-hold) over
# the families dtypes_compat.bats does not mount: Megatron-Core torch_dist
# (megatron-untied, the fp8 MoE megatron-moe-fp8), its zarr backend, a
# Megatron-LM legacy save (tools/fixtures/gen_megatron_legacy_src.py, real
# torch 1.13 torch.save), MindSpore (mindspore-tp2dp2 with its strategy),
# DeepSpeed ZeRO 2 and FSDP2.  Each is mounted at tp=1 and every file of
# ranks/ and hf/ opened by the real loaders (lib/check_dtypes.py: torch
# 1.13 and numpy 1.24, and with the trixie chroot safetensors 0.4.5, torch
# 2.6 and numpy 2.x), each tensor compared with the family's own truth
# (lib/megatron_truth.py, lib/mindspore_truth.py, the fixtures' truth
# manifests); megatron/ is torch.load'ed against the fixture's per-layer
# truth, mindspore/ parsed by lib/check_mindspore.py.  megatron-tied-u32
# (tools/fixtures/gen_megatron_retype.py: two tensors saved as uint32)
# shows megatron/ leaving out what torch 1.13 cannot load.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
LIB=$FLEXFS_SRC/tests/bats/lib
CHECK=$LIB/check_dtypes.py
STUB=$FLEXFS_SRC/tools/fixtures/megatron_stub
MS_STRAT=$FX/mindspore-tp2dp2/strategy/ckpt_strategy_rank_0.ckpt

setup_file() {
	local d=$BATS_FILE_TMPDIR f
	for f in megatron-untied megatron-moe-fp8 megatron-tied-u32; do
		/usr/bin/python3 "$LIB/megatron_truth.py" "$FX/$f" "$d/truth-$f" >/dev/null
	done
	/usr/bin/python3 "$LIB/mindspore_truth.py" "$FX/mindspore-tp2dp2/ckpt" \
		"$MS_STRAT" "$d/truth-mindspore" >/dev/null
	/usr/bin/python3 "$FLEXFS_SRC/tools/fixtures/gen_megatron_legacy_src.py" \
		--src "$FX/megatron-untied" --tp 2 --pp 2 --out "$d/legacy" >/dev/null
}

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# The families: name, source, truth manifest, mount options, the Megatron
# fixture whose per-layer truth megatron/ is checked against ("-": none).
families() {
	local d=$BATS_FILE_TMPDIR
	echo "megatron-untied $FX/megatron-untied/ckpt $d/truth-megatron-untied/manifest.json megatron_true_vocab=200 $FX/megatron-untied"
	echo "megatron-moe-fp8 $FX/megatron-moe-fp8/ckpt $d/truth-megatron-moe-fp8/manifest.json megatron_true_vocab=200 $FX/megatron-moe-fp8"
	echo "megatron-zarr $FX/megatron-zarr/ckpt $d/truth-megatron-untied/manifest.json megatron_true_vocab=200 $FX/megatron-untied"
	echo "megatron-legacy $d/legacy/ckpt $d/legacy/truth/manifest.json megatron_true_vocab=200 $FX/megatron-untied"
	echo "mindspore-tp2dp2 $FX/mindspore-tp2dp2/ckpt $d/truth-mindspore/manifest.json src_strategy=$MS_STRAT -"
	echo "deepspeed-zero2 $FX/deepspeed/zero2-bf16-dp2/ckpt $FX/deepspeed/zero2-bf16-dp2/truth/manifest.json - -"
	echo "fsdp2 $FX/fsdp2/ckpt $FX/fsdp2/truth/manifest.json - -"
}

@test "every family: every file of ranks/, hf/ and megatron/ opens in torch 1.13 and numpy 1.24, each tensor its truth; mindspore/ by its reader" {
	local name src truth opts meg n=0 margs
	while read -r name src truth opts meg; do
		[ "$opts" != - ] || opts=
		margs=()
		[ "$meg" = - ] || margs=(--megatron "$meg" --stub "$STUB")
		mount_ff "$src" "$MNT" "tp=1${opts:+,$opts}"
		run /usr/bin/python3 "$CHECK" --root "$MNT" --truth "$truth" "${margs[@]}"
		echo "$name: $output"
		[ "$status" -eq 0 ]
		[[ $output == *" checks ok, 0 failed" ]]
		if [ "$meg" != - ]; then
			[ -f "$MNT"/megatron/*/mp_rank_00/model_optim_rng.pt ]
		fi
		if [ -d "$MNT/mindspore" ]; then
			run /usr/bin/python3 "$LIB/check_mindspore.py" plan "$MNT" \
				"$(dirname "$truth")" 1 1
			echo "$name mindspore/: $output"
			[ "$status" -eq 0 ]
		fi
		unmount_ff "$MNT"
		[ "$FF_RC" -eq 0 ]
		# nothing of these families is left out: no note
		[ ! -s "$FF_ERR" ]
		n=$((n + 1))
	done < <(families)
	[ "$n" -eq 7 ]
}

@test "every family: the real safetensors 0.4.5, torch 2.6 and numpy 2.x open every file (trixie chroot)" {
	local name src truth opts meg margs
	chroot_dir "$RULES"
	cp "$CHECK" "$CHROOT$CHROOT_IN/"
	cp -r "$STUB" "$CHROOT$CHROOT_IN/stub"
	while read -r name src truth opts meg; do
		[ "$opts" != - ] || opts=
		rm -rf "$CHROOT$CHROOT_IN/fx"
		mkdir -p "$CHROOT$CHROOT_IN/fx/truth"
		cp "$truth" "$CHROOT$CHROOT_IN/fx/truth.json"
		margs=()
		if [ "$meg" != - ]; then
			cp -r "$meg/truth/." "$CHROOT$CHROOT_IN/fx/truth/"
			margs=(--megatron "$CHROOT_IN/fx" --stub "$CHROOT_IN/stub")
		fi
		mount_ff "$src" "$MNT" "tp=1${opts:+,$opts}"
		run chroot "$CHROOT" python3 "$CHROOT_IN/check_dtypes.py" \
			--root "$CHROOT_IN/mnt" --truth "$CHROOT_IN/fx/truth.json" "${margs[@]}"
		echo "$name (torch 2.6): $output"
		unmount_ff "$MNT"
		[ "$status" -eq 0 ]
		[[ $output == *" checks ok, 0 failed" ]]
	done < <(families)
}

# u32 FIXTURE OPTS ARGS...: mount megatron-tied-u32 at tp=1 with OPTS and
# run check_dtypes.py (torch 1.13) with ARGS over ranks/, hf/, megatron/.
u32() {
	local opts=$1

	shift
	mount_ff "$FX/megatron-tied-u32/ckpt" "$MNT" "tp=1,megatron_true_vocab=200${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" --root "$MNT" \
		--truth "$BATS_FILE_TMPDIR/truth-megatron-tied-u32/manifest.json" \
		--megatron "$FX/megatron-tied-u32" --stub "$STUB" "$@"
	echo "megatron-tied-u32 ${opts:-(default)}: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" checks ok, 0 failed" ]]
}

@test "megatron/ leaves out the uint32 tensors torch 1.13 cannot load, as model.pt does; named once; new_dtypes=1 puts them back; exclude_dtypes= applies" {
	u32 ""
	[ -f "$MNT/megatron/iter_0000100/mp_rank_00/model_optim_rng.pt" ]
	run /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1] + "/index.json"))["tensors"]
why = "torch 1.13 has no uint32 (torch >= 2.3 loads it)"
for k in ("decoder.final_layernorm.weight", "decoder.layers.self_attention.linear_proj.weight"):
    assert t[k]["dtype"] == "uint32" and t[k]["left_out"] == {"torch.save": why}, t[k]
assert "left_out" not in t["decoder.layers.mlp.linear_fc2.weight"]
print("ok")' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	cat "$FF_ERR"
	[ "$(wc -l <"$FF_ERR")" -eq 1 ]
	grep -q "^flexfs: .*2 tensor(s) left out.*decoder.final_layernorm.weight (uint32: not in torch.save).*new_dtypes=1" "$FF_ERR"
	# exclude_dtypes=: float32 out of megatron/ too (uint32 stays out)
	u32 "exclude_dtypes=float32" --exclude float32
	unmount_ff "$MNT"
	# new_dtypes=1: back in megatron/ and model.pt, which torch 2.6 loads
	u32 "new_dtypes=1" --new --only safetensors --only npy --only index
	unmount_ff "$MNT"
	[ ! -s "$FF_ERR" ]
	chroot_dir "$RULES"
	cp "$CHECK" "$BATS_FILE_TMPDIR/truth-megatron-tied-u32/manifest.json" "$CHROOT$CHROOT_IN/"
	cp -r "$STUB" "$CHROOT$CHROOT_IN/stub"
	mkdir -p "$CHROOT$CHROOT_IN/fx/truth"
	cp -r "$FX/megatron-tied-u32/truth/." "$CHROOT$CHROOT_IN/fx/truth/"
	mount_ff "$FX/megatron-tied-u32/ckpt" "$MNT" "tp=1,megatron_true_vocab=200,new_dtypes=1"
	run chroot "$CHROOT" python3 "$CHROOT_IN/check_dtypes.py" --new --only pt --only megatron \
		--root "$CHROOT_IN/mnt" --truth "$CHROOT_IN/manifest.json" \
		--megatron "$CHROOT_IN/fx" --stub "$CHROOT_IN/stub"
	echo "megatron-tied-u32 new_dtypes=1 (torch 2.6): $output"
	unmount_ff "$MNT"
	[ "$status" -eq 0 ]
	[[ $output == *" checks ok, 0 failed" ]]
}

@test "index.json, the mount's note and flexfs-inspect name mindspore/ and paddle/ where they are served" {
	local src=$FX/dcp-t26-dtypes/ckpt
	mount_ff "$src" "$MNT" "tp=1,mindspore"
	run /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1] + "/index.json"))["tensors"]
ms = "MindSpore'"'"'s load_checkpoint has no tensor_type for it"
assert t["c64"]["left_out"] == {"safetensors": "safetensors before 0.7 (0.4.5) cannot read C64", "mindspore": ms}, t["c64"]
assert t["c128"]["left_out"]["mindspore"] == ms, t["c128"]
assert "mindspore" not in t["u16"]["left_out"], t["u16"]
assert "left_out" not in t["mat"]
print("ok")' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	cat "$FF_ERR"
	[ "$(wc -l <"$FF_ERR")" -eq 1 ]
	grep -q "c64 (complex64: not in safetensors, mindspore)" "$FF_ERR"
	# without mindspore/ served, no word of it
	mount_ff "$src" "$MNT" "tp=1"
	run /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1] + "/index.json"))["tensors"]
assert all("mindspore" not in e.get("left_out", {}) for e in t.values())
assert "safetensors" in t["c64"]["left_out"]
print("ok")' "$MNT"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	run "$FLEXFS_INSPECT" -o mindspore "$src"
	echo "$output"
	[[ $output == *"complex64 (not in safetensors, mindspore) "* ]]
	[[ $output == *"uint16 (not in torch.save) "* ]]
	run "$FLEXFS_INSPECT" "$src"
	[[ $output != *"mindspore)"* ]]
	# paddle/: holds every dtype; exclude_dtypes= names it too
	mount_ff "$FX/paddle-flex-p4/ckpt" "$MNT" "tp=1,exclude_dtypes=complex64"
	run /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1] + "/index.json"))["tensors"]
assert t["extra.c64"]["left_out"].get("pdparams") == "exclude_dtypes=", t["extra.c64"]
assert "left_out" not in t["extra.f64"]
print("ok")' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	run "$FLEXFS_INSPECT" -o exclude_dtypes=complex64 "$FX/paddle-flex-p4/ckpt"
	[[ $output == *"complex64 (not in safetensors, torch.save, npy, pdparams) "* ]]
}
