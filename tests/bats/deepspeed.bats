#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The DeepSpeed ZeRO source: tests/fixtures/deepspeed/zero{1,2,3}-{fp16,bf16}
# -dp{2,4} (tools/fixtures/gen_deepspeed.py, a stand-in of DeepSpeed
# 0.19.6's save code), each mounted through its save directory (`latest`)
# at tp 1,2 x pp 1,2.  Every byte of every view is checked by
# lib/check_views.py against the truth, the fp32 masters and Adam moments
# computed unpartitioned, which tools/fixtures/zero_to_fp32_oracle.py (an
# independent re-implementation of zero_to_fp32) reproduces from the files;
# hf/ is also read back with torch and compared with the oracle's output,
# ds_weights=module is checked against the module state dict, and the
# views are read by torch 2.6 and the real safetensors in the chroot.
# zero{2,3}-fp16-tp2-dp2 are tensor-parallel ZeRO (2 model-parallel ranks),
# mounted with the rules that state their split axes (ds_tp_rules).

load helpers

FX=$FLEXFS_SRC/tests/fixtures/deepspeed
ORACLE=$FLEXFS_SRC/tools/fixtures/zero_to_fp32_oracle.py

setup() {
	setup_ff
	views_setup
}

teardown() {
	views_teardown
	teardown_ff
}

ds_views() {
	local stage=$1 fx

	for fx in "$FX"/zero"$stage"-*; do
		[[ $fx != *-tp* ]] || continue # below, with their rules
		views_add "$fx/ckpt" "$fx/truth" "" 1x1 2x1 1x2 2x2
	done
	views_check
}

@test "deepspeed ZeRO 1 (fp16, bf16 optimizer; dp 2, 4): every view at tp 1,2 x pp 1,2 equals the truth" {
	ds_views 1
}

@test "deepspeed ZeRO 2 (fp16, bf16; dp 2, 4): every view at tp 1,2 x pp 1,2 equals the truth" {
	ds_views 2
}

@test "deepspeed ZeRO 3 (fp16, bf16; dp 2, 4): every view at tp 1,2 x pp 1,2 equals the truth" {
	ds_views 3
}

@test "deepspeed: hf/ read with torch equals the oracle's zero_to_fp32; the tag directory mounts too" {
	local fx=$FX/zero3-fp16-dp4 exp=$BATS_TEST_TMPDIR/oracle

	/usr/bin/python3 "$ORACLE" --ckpt "$fx/ckpt" --out "$exp"
	mount_ff "$fx/ckpt/global_step5" "$MNT" ""
	run /usr/bin/python3 - "$MNT" "$exp" <<'PY'
import json, os, sys
import torch
mnt, exp = sys.argv[1:]
idx = json.load(open(mnt + "/index.json"))
assert idx["source"]["format"] == "deepspeed-zero", idx["source"]
assert idx["source"]["writer"].startswith("DeepSpeed 0.19.6 ZeRO stage 3"), idx["source"]
pts = sorted(f for f in os.listdir(mnt + "/ranks/tp00_pp00") if f.endswith(".pt"))
sd = torch.load(os.path.join(mnt, "ranks/tp00_pp00", pts[0]))
names = sorted(f[:-4] for f in os.listdir(exp))
assert sorted(sd) == names, (sorted(sd), names)
for n in names:
    t = sd[n].contiguous()
    raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
    assert raw == open(os.path.join(exp, n + ".bin"), "rb").read(), n
print("ok", len(names))
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok 31" ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "deepspeed: a latest naming no directory is refused in one line" {
	local d=$BATS_TEST_TMPDIR/save

	mkdir "$d"
	cp -r "$FX/zero2-fp16-dp2/ckpt/global_step5" "$d/"
	echo global_step6 >"$d/latest"
	run "$FLEXFS_BIN" "$d" "$MNT" -f
	echo "$output"
	[ "$status" -ne 0 ]
	not_mounted "$MNT"
	[[ $output == *"latest: names global_step6, which is not a directory here"* ]]
}

@test "deepspeed ds_weights=module: the module's low-precision weights under the parameter names (torch); refused for stage 3" {
	local fx=$FX/zero2-bf16-dp4

	mount_ff "$fx/ckpt" "$MNT" "ds_weights=module"
	run /usr/bin/python3 - "$MNT" "$fx/ckpt/global_step5/mp_rank_00_model_states.pt" "$FLEXFS_SRC/tools/fixtures" <<'PY'
import sys
import torch
mnt, model, tools = sys.argv[1:]
sys.path.insert(0, tools)
import gen_deepspeed  # noqa: F401 (the stand-in classes, to torch.load the file)
ms = torch.load(model)
sd = torch.load(mnt + "/ranks/tp00_pp00/model.pt")
names = [n for g in ms["param_shapes"] for n in g] + ["head.weight"]
for n in names:
    assert sd[n].dtype == torch.bfloat16, (n, sd[n].dtype)
    assert torch.equal(sd[n], ms["module"][n]), n
# the moments stay the optimizer's fp32 ones
assert sd["optimizer.state.exp_avg.embed.weight"].dtype == torch.float32
print("ok", len(names))
PY
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok 10" ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	mount_refused_line "$FX/zero3-bf16-dp2/ckpt" "ds_weights=module" \
		"*ds_weights: ZeRO stage 3 saves no module weights*"
}

@test "deepspeed: every view read by torch 2.6 and the real safetensors (chroot)" {
	local fx=$FX/zero3-bf16-dp4 rules=$BATS_TEST_TMPDIR/rules.json

	echo '[]' >"$rules"
	chroot_dir "$rules"
	cp "$fx"/truth/* "$CHROOT$CHROOT_IN/truth/"
	chroot_views "$fx/ckpt" 2 2 "" --real-safetensors
}

# Tensor-parallel ZeRO (tools/fixtures/gen_deepspeed.py's zero{2,3}-fp16-
# tp2-dp2: 2 model-parallel x 2 data-parallel ranks).  The files record no
# split axis: the evenly split ones are stated here, the replicated ones
# (equal bytes) and frozen.weight (7 columns cut 4 + 3) are inferred.
ds_tp_rules() {
	cat >"$1" <<'JSON'
[{"match": "*embed.weight", "split": 0},
 {"match": "*head.weight", "split": 0},
 {"match": "*layers.0.fc.*", "split": 0},
 {"match": "*layers.1.fc.weight", "split": 1}]
JSON
}

@test "deepspeed tensor-parallel ZeRO 2, 3 (tp 2 x dp 2) with rules: every view at tp 1,2 x pp 1,2 equals the truth" {
	local rules=$BATS_TEST_TMPDIR/rules.json fx

	ds_tp_rules "$rules"
	for fx in "$FX"/zero2-fp16-tp2-dp2 "$FX"/zero3-fp16-tp2-dp2; do
		views_add "$fx/ckpt" "$fx/truth" "rules=$rules" 1x1 2x1 1x2 2x2
	done
	views_check
}

@test "deepspeed tensor-parallel ZeRO: hf/ equals the oracle merged along the known axes; ranks/ at tp 2 equals each model-parallel rank's own zero_to_fp32" {
	local rules=$BATS_TEST_TMPDIR/rules.json fx stage

	ds_tp_rules "$rules"
	for stage in 2 3; do
		fx=$FX/zero$stage-fp16-tp2-dp2
		/usr/bin/python3 "$ORACLE" --ckpt "$fx/ckpt" --tp-axes "$fx/tp_axes.json" \
			--out "$BATS_TEST_TMPDIR/merged$stage"
		/usr/bin/python3 "$ORACLE" --ckpt "$fx/ckpt" --mp 0 --out "$BATS_TEST_TMPDIR/mp$stage-0"
		/usr/bin/python3 "$ORACLE" --ckpt "$fx/ckpt" --mp 1 --out "$BATS_TEST_TMPDIR/mp$stage-1"
		mount_ff "$fx/ckpt" "$MNT" "tp=2,rules=$rules"
		run /usr/bin/python3 - "$MNT" "$BATS_TEST_TMPDIR" "$stage" <<'PY'
import json, os, sys
import torch
mnt, tmp, stage = sys.argv[1:]
idx = json.load(open(mnt + "/index.json"))
assert idx["source"]["writer"] == \
    "DeepSpeed 0.19.6 ZeRO stage %s, 2 model-parallel ranks" % stage, idx["source"]


def raw(t):
    t = t.contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()


def check(sd, exp):
    names = sorted(f[:-4] for f in os.listdir(exp))
    assert sorted(sd) == names, (sorted(sd), names)
    for n in names:
        assert raw(sd[n]) == open(os.path.join(exp, n + ".bin"), "rb").read(), (exp, n)
    return len(names)


def safetensors(path):
    """The raw bytes of every tensor of a .safetensors file (its 8-byte
    header length, JSON header, data)."""
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    hdr = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in hdr.items() if k != "__metadata__"}


def check_raw(sd, exp):
    names = sorted(f[:-4] for f in os.listdir(exp))
    assert sorted(sd) == names, (sorted(sd), names)
    for n in names:
        assert sd[n] == open(os.path.join(exp, n + ".bin"), "rb").read(), (exp, n)
    return len(names)


n = check_raw(safetensors(mnt + "/hf/model.safetensors"), tmp + "/merged" + stage)
for r in (0, 1):
    n += check(torch.load(mnt + "/ranks/tp%02d_pp00/model.pt" % r), "%s/mp%s-%d" % (tmp, stage, r))
print("ok", n)
PY
		echo "$output"
		[ "$status" -eq 0 ]
		[[ $output == "ok 93" ]]
		unmount_ff "$MNT"
		[ "$FF_RC" -eq 0 ]
	done
}

@test "deepspeed tensor-parallel ZeRO: an evenly split tensor without a rule, or a rule replicating a split one, is refused in one line" {
	local fx=$FX/zero2-fp16-tp2-dp2/ckpt rules=$BATS_TEST_TMPDIR/rules.json

	mount_refused_line "$fx" "" \
		"*mp_rank_01_model_states.pt: embed.weight: *state it with rules=*"
	ds_tp_rules "$rules"
	sed -i 's/"\*embed.weight", "split": 0/"*embed.weight", "split": null/' "$rules"
	mount_refused_line "$fx" "rules=$rules" \
		"*embed.weight: rules= replicate it, but its bytes differ*"
}
