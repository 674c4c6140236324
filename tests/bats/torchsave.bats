#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The torch.save source: tests/fixtures/ts-* (tools/fixtures/gen_torchsave.py,
# written by real torch 1.13 and 2.6): one pytorch_model.bin (zip and
# legacy), transformers' sharded .bin + index, a training checkpoint
# {"model", "optimizer", "step", "config"} .pt.  Each is mounted at tp 1,2 x
# pp 1,2 and every byte of every view is checked against the tensors torch
# saved by lib/check_views.py (ranks/*/model.pt also torch.load'ed by
# torch 1.13; with the trixie chroot, the hf/ safetensors by the real
# library).  Malformed inputs are refused at mount with one line.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check_ts FIXTURE TP PP: mount FIXTURE/ckpt, check every view, unmount
# cleanly; the daemon said nothing.
check_ts() {
	local fx=$FX/$1 tp=$2 pp=$3

	mount_ff "$fx/ckpt" "$MNT" "tp=$tp,pp=$pp,rules=$fx/rules.json"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$fx/truth" \
		--tp "$tp" --pp "$pp" --rules "$fx/rules.json"
	echo "$1 tp=$tp pp=$pp: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	if [ -d /opt/trixie/usr/lib/python3/dist-packages/safetensors ] &&
		[ "$1" = ts-t113-sharded ] && [ "$tp" -eq 2 ]; then
		check_real_st "$fx"
	fi
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

# The hf/ files read by the real safetensors library (torch 2.6) in the
# chroot, against the truth: a copy goes in, the verdict comes out.
check_real_st() {
	local fx=$1 tmp

	tmp=$(mktemp -d /opt/trixie/tmp/flexfs-ts.XXXXXX)
	cp "$MNT"/hf/*.safetensors "$tmp"/
	cp -r "$fx/truth" "$tmp/truth"
	run chroot /opt/trixie python3 -c '
import json, sys, glob, hashlib
from safetensors.torch import load_file
d = sys.argv[1]
m = json.load(open(d + "/truth/manifest.json"))["tensors"]
seen = {}
for f in glob.glob(d + "/*.safetensors"):
    seen.update(load_file(f))
assert set(seen) == set(m), sorted(set(seen) ^ set(m))
for k, t in seen.items():
    e = m[k]
    assert str(t.dtype) == "torch." + e["dtype"] and list(t.shape) == e["shape"], k
    t = t.contiguous()
    b = t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b""
    assert hashlib.sha256(b).hexdigest() == e["sha256"], k
print("real safetensors: %d tensors ok" % len(seen))' "/tmp/$(basename "$tmp")"
	rm -rf "$tmp"
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "torch.save zip (torch 1.13): every view at tp 1,2 x pp 1,2 equals the saved tensors" {
	for tp in 1 2; do for pp in 1 2; do check_ts ts-t113-zip "$tp" "$pp"; done; done
}

@test "torch.save legacy format: every view at tp 1,2 x pp 1,2 equals the saved tensors" {
	for tp in 1 2; do for pp in 1 2; do check_ts ts-t113-legacy "$tp" "$pp"; done; done
}

@test "HF sharded pytorch_model-*.bin + index: every view at tp 1,2 x pp 1,2" {
	for tp in 1 2; do for pp in 1 2; do check_ts ts-t113-sharded "$tp" "$pp"; done; done
}

@test "training checkpoint .pt (torch 1.13): model and optimizer tensors, every view" {
	for tp in 1 2; do for pp in 1 2; do check_ts ts-t113-train "$tp" "$pp"; done; done
}

@test "torch 2.6 files (zip with byteorder, float8, uint16/32/64 through _rebuild_tensor_v3): every view" {
	for tp in 1 2; do for pp in 1 2; do
		check_ts ts-t26-zip "$tp" "$pp"
		check_ts ts-t26-train "$tp" "$pp"
	done; done
}

@test "torch.save: index.json names the format and where the state dict was" {
	mount_ff "$FX/ts-t113-train/ckpt" "$MNT" "tp=1"
	run /usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1] + "/index.json"))["source"]
assert s["format"] == "torch-save", s
assert s["writer"] == "torch.save zip (torch >= 1.6); state dict under '"'"'model'"'"'", s
print("ok")' "$MNT"
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	mount_ff "$FX/ts-t113-legacy/ckpt" "$MNT" "tp=1"
	grep -q '"writer": "torch.save legacy (before torch 1.6)"' "$MNT/index.json"
	unmount_ff "$MNT"
}

@test "torch.save: several candidate files are refused, naming them" {
	local d=$BATS_TEST_TMPDIR/two
	mkdir "$d"
	cp "$FX/ts-t113-train/ckpt/checkpoint.pt" "$d/a.pt"
	cp "$FX/ts-t113-train/ckpt/checkpoint.pt" "$d/b.pth"
	run "$FLEXFS_INSPECT" "$d"
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *"2 torch.save files in the directory (a.pt, b.pth): which one is the checkpoint? Name it with -o torch_file=NAME"* ]]
	[ "$(printf '%s\n' "$output" | wc -l)" -eq 1 ]
	# named: that one is read, the other passed through unchanged
	cp "$FX/ts-t113-train/rules.json" "$d/../rules.json"
	mount_ff "$d" "$MNT" "tp=2,pp=2,torch_file=a.pt,rules=$d/../rules.json"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$FX/ts-t113-train/truth" \
		--tp 2 --pp 2 --rules "$d/../rules.json"
	echo "$output"
	[ "$status" -eq 0 ]
	cmp "$d/b.pth" "$MNT/hf/b.pth"
	unmount_ff "$MNT"
	ff_quiet
}

@test "torch.save: an index naming a tensor its shard lacks is refused" {
	local d=$BATS_TEST_TMPDIR/sh
	cp -r "$FX/ts-t113-sharded/ckpt" "$d"
	/usr/bin/python3 - "$d/pytorch_model.bin.index.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["weight_map"]["ghost.weight"] = "pytorch_model-00001-of-00003.bin"
json.dump(j, open(sys.argv[1], "w"))
EOF
	run "$FLEXFS_INSPECT" "$d"
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *"pytorch_model.bin.index.json: ghost.weight: weight_map lists it in pytorch_model-00001-of-00003.bin, which has no such tensor"* ]]
}

@test "training checkpoint: values that are not tensors are objects/ files torch.load reads back equal" {
	mount_ff "$FX/ts-t113-train/ckpt" "$MNT" "tp=1"
	[ "$(ls "$MNT/objects" | tr '\n' ' ')" = "config.pt optimizer.param_groups.pt step.pt " ]
	run /usr/bin/python3 -c '
import sys, torch
m, ck = sys.argv[1], torch.load(sys.argv[2])
want = {"step": ck["step"], "config": ck["config"],
        "optimizer.param_groups": ck["optimizer"]["param_groups"]}
for k, v in want.items():
    got = torch.load("%s/objects/%s.pt" % (m, k))
    assert got == v and type(got) is type(v), (k, got, v)
print("ok")' "$MNT" "$FX/ts-t113-train/ckpt/checkpoint.pt"
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
	ff_quiet
}
