#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# AOA statements (rules file v2, reshard/paddle/aoa.h) through real mounts: an
# HF-named checkpoint written with torch (lib/aoa_oracle.py gen) is served
# in PaddleNLP's layout (transposed linears, interleaved GQA qkv, per-rank
# [gate_r | up_r] that depends on the TP degree, router cast to fp32, tied
# head, drop) and checked against torch computing each operation itself
# (casts against torch's own .to()); the inverse statements, mounted on
# the first mount's hf/ tree, give back the original bit for bit.
# Concatenation then re-split (boxes straddling the boundary), name[a:b],
# prefix*suffix and $LAYER_ID_OFFSET, the warning of a statement that
# matches nothing, and the refusals (_ -> B, malformed statements).

load helpers

ORACLE=$FLEXFS_SRC/tests/bats/lib/aoa_oracle.py
RULES_DIR=$FLEXFS_SRC/tests/bats/lib/aoa

setup_file() {
	/usr/bin/python3 "$ORACLE" gen "$BATS_FILE_TMPDIR/hf" 7
}

setup() {
	setup_ff
	SRC=$BATS_FILE_TMPDIR/hf
}

teardown() {
	teardown_ff
}

@test "aoa: HF -> Paddle layout (transpose, fused_qkv, fused_ffn per TP, cast, tied, drop) at tp 1 and 2" {
	for tp in 1 2; do
		mount_ff "$SRC" "$MNT" "tp=$tp,rules=$RULES_DIR/hf_to_paddle_cast.json"
		run /usr/bin/python3 "$ORACLE" check "$MNT" "$SRC" paddle "$tp"
		echo "tp=$tp: $output"
		[ "$status" -eq 0 ]
		[[ $output == *"checked 21 tensors, 0 wrong"* ]]
		unmount_ff "$MNT"
		ff_quiet
	done
}

@test "aoa: the fused_ffn layout follows the TP degree (tp 2 statements checked as tp 1 fail)" {
	mount_ff "$SRC" "$MNT" "tp=2,rules=$RULES_DIR/hf_to_paddle_cast.json"
	run /usr/bin/python3 "$ORACLE" check "$MNT" "$SRC" paddle 1
	[ "$status" -eq 1 ]
	[[ $output == *"differs model.layers.0.mlp.up_gate_proj.weight"* ]]
	unmount_ff "$MNT"
}

@test "aoa: HF -> Paddle (tp 2) -> HF through two stacked mounts equals the original bit for bit" {
	local m2=$BATS_TEST_TMPDIR/m2 p1

	mkdir -p "$m2"
	mount_ff "$SRC" "$MNT" "tp=2,rules=$RULES_DIR/hf_to_paddle.json"
	p1=$FF_PID
	mount_ff "$MNT/hf" "$m2" "rules=$RULES_DIR/paddle_to_hf.json"
	run /usr/bin/python3 "$ORACLE" same "$m2" "$SRC"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"checked 30 tensors, 0 wrong"* ]]
	unmount_ff "$m2"
	FF_PID=$p1
	unmount_ff "$MNT"
}

@test "aoa: concat then split across the boundary, reshape (stacked layers unstacked), name[a:b], prefix*suffix, \$LAYER_ID_OFFSET; unmatched statements warn" {
	mount_ff "$SRC" "$MNT" "tp=2,rules=$RULES_DIR/concat.json"
	run /usr/bin/python3 "$ORACLE" check "$MNT" "$SRC" concat 2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"checked 11 tensors, 0 wrong"* ]]
	unmount_ff "$MNT"
	grep -q "AOA statement 5 matches no tensor: model.layers.99.nothing -> x" "$FF_ERR"
	grep -q "AOA statement 3: layer 0 has no layer before it" "$FF_ERR"
}

@test "aoa: _ -> B and malformed statements are refused with one line naming statement and column" {
	local r=$BATS_TEST_TMPDIR/r.json

	echo '{"aoa_statements": ["_ -> model.norm.weight"]}' >"$r"
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$r"
	[ "$status" -ne 0 ]
	[[ $output == *"statement 1: '_ -> model.norm.weight': a view cannot invent data"* ]]
	echo '{"aoa_statements": ["a -> b", "x, -> y"]}' >"$r"
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$r"
	[ "$status" -ne 0 ]
	[[ $output == *"aoa_statements: statement 2 column 4: expected a name, found '->'"* ]]
	echo '{"aoa_statements": ["a^T -> b^T"]}' >"$r"
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$r"
	[[ $output == *"statement 1 column 9: ^T on the destination side"* ]]
	echo '{"aoa_statements": ["a -> b, axis=1, colour=2"]}' >"$r"
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$r"
	[[ $output == *"statement 1 column 17: unknown attribute 'colour'"* ]]
	# a fused macro with a cast: refused (it was dropped, serving bf16)
	cat >"$r" <<'JSON'
{"aoa_statements": ["model.layers.0.mlp.gate_proj.weight, model.layers.0.mlp.up_proj.weight -> gu, fused_ffn, dtype='float32'"]}
JSON
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$r"
	[ "$status" -ne 0 ]
	[[ $output == *"r.json: aoa_statements: statement 1 column 72: fused_ffn takes no dtype or permute"* ]]
	[ "${#lines[@]}" -eq 1 ]
	echo '{"aoa_statements": ["a -> b, src_tp=2"]}' >"$r"
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$r"
	[ "$status" -ne 0 ]
	[[ $output == *"statement 1 column 3: src_tp or dst_tp without fused_ffn or fused_qkv_old"* ]]
	echo '{"aoa_statements": ["a -> b"], "rule": []}' >"$r"
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$r"
	[[ $output == *"rule: unknown key of the rules object"* ]]
}

@test "aoa: flexfs-inspect prints each target's statements and source boxes, --json too" {
	run "$FLEXFS_INSPECT" "$SRC" -o "tp=2,rules=$RULES_DIR/concat.json"
	[ "$status" -eq 0 ]
	[[ $output == *"cut_1  (stmt 2 <- stmt 1)"* ]]
	[[ $output == *"    model.layers.1.mlp.gate_proj.weight[12:24, 0:32] -> [0:12, 32:64]"* ]]
	[[ $output == *"AOA statement 5 matches no tensor"* ]]
	run "$FLEXFS_INSPECT" "$SRC" -o "rules=$RULES_DIR/hf_to_paddle_cast.json" --json
	[ "$status" -eq 0 ]
	run /usr/bin/python3 -c '
import json, sys
a = json.loads(sys.argv[1])["aoa"]
t = a["model.layers.2.mlp.up_gate_proj.weight"]
assert t["statements"] == "stmt 3", t
assert t["sources"] == [
    "model.layers.2.mlp.gate_proj.weight[0:48, 0:32] permute(1,0) -> [0:32, 0:48]",
    "model.layers.2.mlp.up_proj.weight[0:48, 0:32] permute(1,0) -> [0:32, 48:96]"], t
assert a["model.layers.0.mlp.gate.weight"]["sources"] == [
    "model.layers.0.mlp.gate.weight[0:4, 0:32] cast(float32) -> [0:4, 0:32]"]
assert a["lm_head.weight"]["sources"] == [
    "model.embed_tokens.weight[0:64, 0:32] -> [0:64, 0:32]"]
print("ok")' "$output"
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "aoa: every operation on random shapes and dtypes against torch, targets split over tp 3 and 2; optimizer states follow" {
	local seed tp d

	for seed in 11 13; do
		tp=$((seed % 3 + 1))
		d=$BATS_TEST_TMPDIR/r$seed
		mkdir -p "$d"
		/usr/bin/python3 "$ORACLE" random "$d/ck" "$seed" "$tp"
		mount_ff "$d/ck" "$MNT" "tp=$tp,rules=$d/rules$seed.json"
		run /usr/bin/python3 "$ORACLE" check-random "$MNT" "$d/ck" "$seed" "$tp"
		echo "seed $seed tp $tp: $output"
		[ "$status" -eq 0 ]
		[[ $output == *" tensors, 0 wrong"* ]]
		unmount_ff "$MNT"
		ff_quiet
	done
}

@test "aoa: a 65,536-statement chain of renames and a 65,536-way fan-out inspect under 1 GiB and 60 s; a 17th concat doubling is refused naming the statement" {
	local e=model.layers.0.mlp.up_proj.weight
	/usr/bin/python3 - "$BATS_TEST_TMPDIR" "$e" <<'PY'
import json, sys
d, e = sys.argv[1], sys.argv[2]
n = 65536
json.dump({"aoa_statements": [f"{e} -> t0"] + [f"t{i} -> t{i+1}" for i in range(n - 1)]}, open(f"{d}/chain.json", "w"))
json.dump({"aoa_statements": [f"{e} -> f{i}" for i in range(n)]}, open(f"{d}/fan.json", "w"))
json.dump({"aoa_statements": [f"{e}, {e} -> d0, axis=0"] + [f"d{i}, d{i} -> d{i+1}, axis=0" for i in range(17)]}, open(f"{d}/double.json", "w"))
PY
	# before: 50 GB and minutes (quadratic in the statements)
	run bash -c "$(vm_limit 1048576)timeout 60 '$FLEXFS_INSPECT' '$SRC' -o 'rules=$BATS_TEST_TMPDIR/chain.json' | grep -c '^t65535 .*(stmt 65536 <- stmt 65535 <- .* \\.\\.\\.)\$'"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" = 1 ]
	run bash -c "$(vm_limit 1048576)timeout 60 '$FLEXFS_INSPECT' '$SRC' -o 'rules=$BATS_TEST_TMPDIR/fan.json' | grep -c '^f[0-9]*  (stmt [0-9]*)\$'"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" = 65536 ]
	run bash -c "$(vm_limit 1048576)timeout 60 '$FLEXFS_INSPECT' '$SRC' -o 'rules=$BATS_TEST_TMPDIR/double.json'"
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *'statement 17: a tensor made of more than 65536 boxes (in "d15, d15 -> d16, axis=0")'* ]]
}
