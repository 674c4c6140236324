#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The Paddle Flex Checkpoint source: the tests/fixtures/paddle-* fixtures
# (tools/fixtures/gen_paddle.py, a stand-in writer exact to the spec: both
# metadata module paths, protocols 4 and 5, numpy 1.x and 2.x names, bf16
# as uint16 bits, float8, a dtype zoo, uneven splits, TP x sharding stage 1
# v2 with flattened optimizer shards cut mid-row, save_replicas), each
# mounted at tp 1, 2, 4 x pp 1, 2 and every byte of every generic view
# (index.json, ranks/*/model.safetensors, npy, hf/) checked by
# lib/check_views.py against the truth lib/paddle_truth.py takes from the
# fixture.  Several ids in one directory: the highest, or -o paddle_id=N.

load helpers

FX=$FLEXFS_SRC/tests/fixtures
CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py
TRUTH=$FLEXFS_SRC/tests/bats/lib/paddle_truth.py

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check_paddle NAME DIR TP PP [OPTS] [TRUTH ARGS...]: mount DIR at tp/pp,
# check every view against the truth of fixture NAME, unmount cleanly;
# the daemon said nothing.
check_paddle() {
	local fx=$1 dir=$2 tp=$3 pp=$4 opts=${5:-}
	local truth=$BATS_TEST_TMPDIR/truth-$fx${5:+-$5}

	shift 5 || shift $#
	[ -d "$truth" ] || /usr/bin/python3 "$TRUTH" "$FX/$fx" "$truth" "$@"
	mount_ff "$dir" "$MNT" "tp=$tp,pp=$pp${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$truth" \
		--tp "$tp" --pp "$pp"
	echo "$fx tp=$tp pp=$pp $opts: $output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	[ ! -s "$FF_ERR" ]
}

@test "paddle flex p4, p5: every view at tp 1,2,4 x pp 1,2 equals the truth" {
	for fx in paddle-flex-p4 paddle-flex-p5; do
		for tp in 1 2 4; do
			for pp in 1 2; do
				check_paddle "$fx" "$FX/$fx/ckpt" "$tp" "$pp"
			done
		done
	done
}

@test "paddle sharding v2 (flattened shards cut mid-row, replicas): every view at tp 1,2,4 x pp 1,2" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_paddle paddle-flex-np2-sharding \
				"$FX/paddle-flex-np2-sharding/ckpt" "$tp" "$pp"
		done
	done
}

@test "paddle PaddleFormers model_state and optimizer_state: every view at tp 1,2,4" {
	local d=$FX/paddle-formers-np2-p4/ckpt/checkpoint-5

	for tp in 1 2 4; do
		check_paddle paddle-formers-np2-p4 "$d/model_state" "$tp" 1 "" \
			--part model_state
	done
	rm -rf "$BATS_TEST_TMPDIR"/truth-*
	for tp in 1 2 4; do
		check_paddle paddle-formers-np2-p4 "$d/optimizer_state" "$tp" 2 "" \
			--part optimizer_state
	done
}

@test "paddle several ids: the highest by default, paddle_id=N picks one" {
	local d=$FX/paddle-multi-id/ckpt

	check_paddle paddle-multi-id "$d" 2 1
	check_paddle paddle-multi-id "$d" 1 1 paddle_id=3 --id 3
	check_paddle paddle-multi-id "$d" 2 2 paddle_id=10 --id 10
	mount_ff "$d" "$MNT" "paddle_id=10"
	run /usr/bin/python3 - "$MNT/index.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["source"]["format"] == "paddle-dcp", d["source"]
assert d["source"]["writer"].startswith("Paddle Flex Checkpoint"), d["source"]
assert "id 10" in d["source"]["writer"], d["source"]
print("ok")
EOF
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
}

@test "paddle: refused at mount in one line: a missing id, protocol-2 text bytes" {
	run "$FLEXFS_BIN" "$FX/paddle-multi-id/ckpt" "$MNT" -f -o paddle_id=5
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *"5.metadata: paddle_id: no such file (the highest id here is 10)"* ]]
	[ "$(grep -c . <<<"$output")" -eq 1 ]
	run "$FLEXFS_BIN" "$FX/paddle-multi-id/ckpt" "$MNT" -f -o paddle_id=0
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *"0_0.distcp: llama.embed_tokens.weight: protocol-2 array bytes are stored as UTF-8 text"* ]]
	[ "$(grep -c . <<<"$output")" -eq 1 ]
	mkdir "$BATS_TEST_TMPDIR/empty"
	run "$FLEXFS_BIN" "$BATS_TEST_TMPDIR/empty" "$MNT" -f
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *"no <id>.metadata (Paddle Flex Checkpoint)"* ]]
	[ "$(grep -c . <<<"$output")" -eq 1 ]
}
