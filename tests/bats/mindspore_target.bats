#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The mindspore/ tree: rank_N/checkpoint_N.ckpt, MindSpore .ckpt files of
# the target ranks.  lib/check_mindspore.py parses every served file with
# python3-protobuf and the spec's schema as load_checkpoint does (records
# joined by tag, tensor_type to numpy, dims) and compares each tensor with
# the truth sliced by an independent implementation of the target layout
# (check_views.expected_plan for tp/pp).

load helpers

FX=$FLEXFS_SRC/tests/fixtures
CHECK=$FLEXFS_SRC/tests/bats/lib/check_mindspore.py

setup() {
	setup_ff
}

teardown() {
	teardown_ff
}

# check_plan DIR TRUTH TP PP [OPTS]: mount DIR with mindspore at tp/pp,
# check every rank file, unmount cleanly; the daemon said nothing but the
# note about FSDP's data-parallel shards.
check_plan() {
	local dir=$1 truth=$2 tp=$3 pp=$4 opts=${5:-} rules=
	[[ $opts == *rules=* ]] && rules=${opts#*rules=} && rules=${rules%%,*}
	mount_ff "$dir" "$MNT" "tp=$tp,pp=$pp,mindspore${opts:+,$opts}"
	run /usr/bin/python3 "$CHECK" plan "$MNT" "$truth" "$tp" "$pp" $rules
	echo "$dir tp=$tp pp=$pp $opts: $output"
	[ "$status" -eq 0 ]
	[[ $output == "$((tp * pp)) files equal" ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	! grep -v "data-parallel shards along dim 0 (FSDP)" "$FF_ERR"
}

@test "mindspore/ of dcp-t113 at tp 1,2,4 x pp 1,2: every rank's .ckpt as load_checkpoint reads it" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			check_plan "$FX/dcp-t113/ckpt" "$FX/dcp-t113/truth" "$tp" "$pp" \
				"rules=$RULES"
		done
	done
}

@test "mindspore/ of FSDP2 x TP and FSDP2 checkpoints at tp 2" {
	check_plan "$FX/fsdp2-tp/ckpt" "$FX/fsdp2-tp/truth" 2 1
	check_plan "$FX/fsdp2/ckpt" "$FX/fsdp2/truth" 2 2
}

@test "mindspore/ only when asked for: a DCP mount's root is unchanged without it" {
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES"
	[ ! -e "$MNT/mindspore" ]
	unmount_ff "$MNT"
	mount_ff "$FIXTURE" "$MNT" "tp=2,rules=$RULES,mindspore=0"
	[ ! -e "$MNT/mindspore" ]
	unmount_ff "$MNT"
}

@test "mindspore/: a dtype load_checkpoint cannot read refuses the mount in one line" {
	run "$FLEXFS_BIN" "$FX/dcp-zstd-mini/ckpt" "$MNT" -f -o mindspore
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *"mindspore/rank_0/checkpoint_0.ckpt: fp8.weight: dtype float8_e4m3fn: no MindSpore tensor_type load_checkpoint reads"* ]]
	[ "$(grep -c . <<<"$output")" -eq 1 ]
}
