#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# -o gpu=, gpu_min=, gpu_device= through the daemon, on any machine: a stub
# of libflexfs-cuda.so (tests/unit/stub_cuda.c, named by $FLEXFS_CUDA_LIB,
# told what to do by $FLEXFS_CUDA_STUB) stands for the CUDA backend.
# gpu=on without a device fails the mount with one line; gpu=auto mounts
# on the CPU and says nothing; a backend that loads serves the strided
# gathers (dcp-t113's transposed tensor), is named in index.json, by
# flexfs-inspect and (gpu=on) in the mount log, and every view equals the truth --
# unless the stub corrupts its bytes, which the oracle must then see.  It
# serves the casts of the transform rules with their gathers too (every
# float pair against torch's .to()).  The last test does the same with the
# real libflexfs-cuda.so when a device is present (tools/gpu-check.sh),
# and is skipped with one line when not.

load helpers

PY=/usr/bin/python3
CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py
TRUTH=$FLEXFS_SRC/tests/fixtures/dcp-t113/truth

setup() {
	setup_ff
	export FLEXFS_CUDA_LIB=$FLEXFS_CUDA_STUB_LIB
}

teardown() {
	teardown_ff
	unset FLEXFS_CUDA_LIB FLEXFS_CUDA_STUB
}

# start_fails OPTS LINE: the daemon exits 1 before mounting, its stderr
# exactly LINE
start_fails() {
	run --separate-stderr "$FLEXFS_BIN" "$FIXTURE" "$MNT" -f -o "$1" 3>&-
	echo "$stderr"
	[ "$status" -eq 1 ]
	[ "$stderr" = "$2" ]
	! mountpoint -q "$MNT"
}

# quiet OPTS: mounts on the CPU, reads a view and says nothing
quiet() {
	mount_ff "$FIXTURE" "$MNT" "tp=3,pp=2,rules=$RULES,$1"
	cat "$MNT"/ranks/*/model.safetensors >/dev/null
	grep -qx ' "slicer": "cpu",' "$MNT/index.json"
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

# views OPTS: mount, check every view of tp 3 x pp 2; $output: the report
views() {
	mount_ff "$FIXTURE" "$MNT" "tp=3,pp=2,rules=$RULES,$1"
	grep -qx ' "slicer": "cuda",' "$MNT/index.json"
	run "$PY" "$CHECK" -q --mount "$MNT" --truth "$TRUTH" --tp 3 --pp 2 \
		--rules "$RULES"
	echo "$output"
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}

@test "gpu=on without a device, a driver or the library: the mount fails with one line" {
	require_bins
	export FLEXFS_CUDA_STUB=nodev
	start_fails "gpu=on" \
		"flexfs: gpu=on: no usable CUDA device: no CUDA device (stub)"
	export FLEXFS_CUDA_STUB=driver
	start_fails "gpu=on,gpu_device=1" \
		"flexfs: gpu=on: no usable CUDA device: cudaGetDeviceCount: driver error (stub)"
	export FLEXFS_CUDA_LIB=/nonexistent/libflexfs-cuda.so
	start_fails "gpu=on" \
		"flexfs: gpu=on: no usable CUDA device: libflexfs-cuda.so not loaded (/nonexistent/libflexfs-cuda.so: cannot open shared object file: No such file or directory)"
	start_fails "gpu=maybe" \
		"flexfs: gpu: 'maybe' is not auto, on or off"
	# flexfs-inspect refuses it alike
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o "gpu=on,rules=$RULES"
	[ "$status" -eq 1 ]
	[ "$stderr" = "flexfs-inspect: gpu=on: no usable CUDA device: libflexfs-cuda.so not loaded (/nonexistent/libflexfs-cuda.so: cannot open shared object file: No such file or directory)" ]
}

@test "flexfs-inspect names the backend of the strided gathers, and its index.json records it" {
	require_bins
	export FLEXFS_CUDA_STUB=ok
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o "rules=$RULES,gpu_device=1"
	[ "$status" -eq 0 ]
	[[ $output == *$'\nstrided gathers and casts: slicer: cuda on device 1 (Stub GPU) for strided gathers and casts of 1048576 bytes or more, cpu below'* ]]
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" --json -o "rules=$RULES"
	[[ $output == *$'\n "slicer": "cuda",\n "slicer_serves": "strided gathers, casts",\n'* ]]
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" --json -o "rules=$RULES,gpu=off"
	[[ $output == *$'\n "slicer": "cpu",\n'* ]]
}

@test "gpu=auto without a device: the CPU serves, nothing said" {
	require_fuse
	require_bins
	export FLEXFS_CUDA_STUB=nodev
	quiet "gpu=auto,gpu_min=0"
	export FLEXFS_CUDA_STUB=driver
	quiet "gpu_min=0"
}

@test "a device backend serves the gathers: named in the mount log, the same bytes" {
	require_fuse
	require_bins
	export FLEXFS_CUDA_STUB=ok
	views "gpu=on,gpu_min=0,gpu_device=2"
	[[ $output == *" passed, 0 failed"* ]]
	[ "$(cat "$FF_ERR")" = "flexfs: slicer: cuda on device 2 (Stub GPU) for strided gathers and casts of 0 bytes or more, cpu below" ]
	# gpu=auto takes the device as well, and says nothing
	views "gpu_min=0"
	[[ $output == *" passed, 0 failed"* ]]
	ff_quiet
	# the bytes did come from the backend: corrupted there, seen here
	export FLEXFS_CUDA_STUB=corrupt
	views "gpu_min=0"
	[[ $output != *" passed, 0 failed"* ]]
	# gpu=off: the backend is never loaded
	quiet "gpu=off,gpu_min=0"
}

@test "a device backend serves the casts with their gathers: torch's .to() bit for bit, the bytes its own" {
	require_fuse
	require_bins
	local d=$BATS_TEST_TMPDIR/r11 oracle=$FLEXFS_SRC/tests/bats/lib/aoa_oracle.py

	mkdir -p "$d"
	# every float pair cast (and transposes, permutes, ...) over tp 3
	"$PY" "$oracle" random "$d/ck" 11 3
	export FLEXFS_CUDA_STUB=ok
	mount_ff "$d/ck" "$MNT" "tp=3,rules=$d/rules11.json,gpu_min=0"
	grep -qx ' "slicer": "cuda",' "$MNT/index.json"
	run "$PY" "$oracle" check-random "$MNT" "$d/ck" 11 3
	echo "$output"
	[[ $output == *" tensors, 0 wrong"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	# the converted bytes came from the backend: corrupted there, seen
	# here (the casts among the tensors found wrong)
	export FLEXFS_CUDA_STUB=corrupt
	mount_ff "$d/ck" "$MNT" "tp=3,rules=$d/rules11.json,gpu_min=0"
	run "$PY" "$oracle" check-random "$MNT" "$d/ck" 11 3
	echo "$output"
	[[ $output == *"cast_"* ]]
	[[ $output != *" tensors, 0 wrong"* ]]
	unmount_ff "$MNT"
}

@test "the real CUDA backend, when a device is present: every view and every cast bit for bit" {
	require_fuse
	require_bins
	local d=$BATS_TEST_TMPDIR/r13 oracle=$FLEXFS_SRC/tests/bats/lib/aoa_oracle.py

	# libflexfs-cuda.so as the daemon finds it (next to it, installed,
	# the build tree), on device 0; skipped with one line without one
	unset FLEXFS_CUDA_LIB
	run --separate-stderr "$FLEXFS_INSPECT" "$FIXTURE" -o "rules=$RULES,gpu=on"
	[ "$status" -eq 0 ] || skip "no CUDA device: ${stderr#flexfs-inspect: }"
	views "gpu=on,gpu_min=0"
	[[ $output == *" passed, 0 failed"* ]]
	[[ $(cat "$FF_ERR") == "flexfs: slicer: cuda on device 0 ("* ]]
	mkdir -p "$d"
	"$PY" "$oracle" random "$d/ck" 13 2
	mount_ff "$d/ck" "$MNT" "tp=2,rules=$d/rules13.json,gpu=on,gpu_min=0"
	run "$PY" "$oracle" check-random "$MNT" "$d/ck" 13 2
	echo "$output"
	[[ $output == *" tensors, 0 wrong"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
}
