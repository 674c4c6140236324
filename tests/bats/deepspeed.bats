#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The DeepSpeed ZeRO source: tests/fixtures/deepspeed/zero{1,2,3}-{fp16,bf16}
# -dp{2,4} (tools/fixtures/gen_deepspeed.py, a stand-in of DeepSpeed
# 0.19.6's save code), each mounted through its save directory (`latest`)
# at tp 1,2 x pp 1,2.  Every byte of every view is checked by
# lib/check_views.py against the truth, the fp32 masters and Adam moments
# computed unpartitioned, which tools/fixtures/zero_to_fp32_oracle.py (an
# independent re-implementation of zero_to_fp32) reproduces from the files;
# hf/ is also read back with torch and compared with the oracle's output.

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
