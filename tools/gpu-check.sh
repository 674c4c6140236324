#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The GPU checks of issue #22 in one shot, for a session lent a CUDA device
# (docs/performance.md, "GPU slicing"): on the device machine, from the
# repository root,
#
#   OUT=/some/dir tools/gpu-check.sh [BUILD_DIR]      (default build-gpu/)
#
#   1. builds with CUDA into BUILD_DIR (libflexfs-cuda.so, the daemon, the
#      tests; warnings are errors for nvcc too); a BUILD_DIR made by
#      tools/gpu-pack.sh (no CMakeCache.txt, fs/flexfs in it) is used as
#      it is, for device machines that cannot build: its lib/ goes on
#      LD_LIBRARY_PATH when the loader lacks a library, its bin/ and
#      bats/bin/ on PATH;
#   2. runs test_slice, which checks the CUDA backend against the oracles
#      when it opens a device: the 3,000 random slices, every transpose,
#      the 600 random batches and the 384 cast batches;
#   3. runs the slicer's bats (gpu.bats: its last test mounts with the real
#      backend, gpu=on,gpu_min=0; gather.bats; aoa.bats, the casts) when
#      bats and /dev/fuse are there;
#      then flexfs-slice-bench: the slicer alone, CPU vs CUDA backend per
#      batch size, its table in summary.txt, slice.json;
#   4. runs flexfs-bench --only transposed,gpu (figure 3t: transposed bf16
#      gathers, 256 MiB, 5 runs, every byte checked; GPU vs CPU backend in
#      the same run, GPU vs the host-to-device bandwidth, and the same
#      tensors cast to float32, GPU vs CPU, the GPU's bytes equal to the
#      CPU's), at most 6 minutes, writing $OUT/gpu.json.
#
# Logs go to $OUT (default ./gpu-check-out): summary.txt (one line per
# step), device.txt, cmake.log, build.log, test_slice.log, bats.log,
# bench.log, gpu.json.  Without a usable device it stops after step 2 with
# one line "gpu-check: SKIP: ..." and exits 0; a failed step exits 1.
# Budget: about 2 minutes of build on 16 cores, 1 of tests, under 6 of
# bench: run it with a 10-minute limit (the whole of one device command).
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$root/build-gpu}")
out=${OUT:-$root/gpu-check-out}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
status=0

mkdir -p "$out" || exit 1
: >"$out/summary.txt"

say() {
	echo "gpu-check: $*" | tee -a "$out/summary.txt"
}

# step NAME LOG CMD...: run CMD with its output in LOG, say how it went
step() {
	local name=$1 log=$2 t0=$SECONDS rc

	shift 2
	"$@" >"$log" 2>&1
	rc=$?
	if [ "$rc" -eq 0 ]; then
		say "ok: $name ($((SECONDS - t0)) s)"
	else
		say "FAIL: $name (exit $rc, $((SECONDS - t0)) s; see $log)"
		status=1
	fi
	return "$rc"
}

# GPU_CHECK_BATS: the bats files of step 3 (default: gpu gather aoa)
bats_files=${GPU_CHECK_BATS:-gpu gather aoa}

slicer_bats() {
	if [ -f "$build/CMakeCache.txt" ]; then
		(cd "$build" && ctest -R "^e2e_(${bats_files// /|})\$" --output-on-failure -V)
	else
		FLEXFS_BIN=$build/fs/flexfs FLEXFS_INSPECT=$build/tools/flexfs-inspect \
			FLEXFS_CUDA_STUB_LIB=$build/tests/libflx_stub_cuda.so FLEXFS_SRC=$root \
			bats $(printf "$root/tests/bats/%s.bats " $bats_files)
	fi
}

{
	date -u
	uname -a
	command -v nvidia-smi >/dev/null &&
		nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
	command -v nvcc >/dev/null && nvcc --version | tail -2
} >"$out/device.txt" 2>&1

# prebuilt BUILD_DIR: the environment its binaries need, said once
use_pack() {
	export PATH=$build/bin:$build/bats/bin:$PATH
	if ldd "$build/fs/flexfs" "$build/tools/flexfs-inspect" | grep -q "not found"; then
		export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
		say "prebuilt: LD_LIBRARY_PATH=$build/lib ($(ls "$build/lib" | tr '\n' ' '))"
	fi
	# the tests' and the bench's /usr/bin/python3, given the packages of
	# the python3 on PATH (same version) when it lacks torch or numpy
	if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null &&
		python3 -c 'import torch, numpy' 2>/dev/null &&
		[ "$(python3 -c 'import sys; print(sys.version_info[:2])')" = \
			"$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])' 2>/dev/null)" ]; then
		PYTHONPATH=$(python3 -c 'import site; print(":".join(site.getsitepackages()))')
		export PYTHONPATH
		say "prebuilt: PYTHONPATH=$PYTHONPATH for /usr/bin/python3"
	fi
	if [ ! -e /dev/fuse ] && mknod -m 666 /dev/fuse c 10 229 2>/dev/null; then
		say "prebuilt: made /dev/fuse"
	fi
	say "prebuilt: $build (no build here)"
}

# 1. the build
if [ ! -f "$build/CMakeCache.txt" ] && [ -x "$build/fs/flexfs" ]; then
	use_pack
elif ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
	say "FAIL: no nvcc (CUDA toolkit) on this machine: libflexfs-cuda.so cannot be built"
	exit 1
else
	step "configure ($build)" "$out/cmake.log" \
		cmake -S "$root" -B "$build" -DFLEXFS_WITH_CUDA=ON || exit 1
	if ! grep -q "CUDA: ON" "$out/cmake.log"; then
		say "FAIL: CMake did not find the CUDA toolkit (see $out/cmake.log)"
		exit 1
	fi
	step "build with CUDA" "$out/build.log" \
		cmake --build "$build" -j"$jobs" || exit 1
fi

# 2. the equivalence test, which is also the probe of the device
step "test_slice" "$out/test_slice.log" "$build/tests/test_slice"
line=$(grep -m1 -e "^test_slice: CUDA backend skipped: " \
	-e "^test_slice: checking the CUDA backend: " "$out/test_slice.log")
case $line in
*"CUDA backend skipped: "*)
	why=${line#*skipped: }
	say "SKIP: no usable CUDA device here (${why#gpu=on: no usable CUDA device: }); the CPU checks ran, nothing was measured"
	exit "$status"
	;;
*"checking the CUDA backend: "*)
	say "device: ${line#*backend: }"
	;;
*)
	say "FAIL: test_slice said nothing of the CUDA backend (see $out/test_slice.log)"
	exit 1
	;;
esac

# the slicer alone per batch size (tools/bench/slice_bench.c), the table
# in the summary
if step "flexfs-slice-bench" "$out/slice.log" timeout 120 \
	"$build/tools/bench/flexfs-slice-bench" --json "$out/slice.json"; then
	cat "$out/slice.log" >>"$out/summary.txt"
	rm -f "$out/slice.log"
fi

# 3. the slicer's bats, the real backend among them
if ! command -v bats >/dev/null || [ ! -w /dev/fuse ]; then
	say "SKIP: bats (needs bats and a writable /dev/fuse)"
else
	step "bats $bats_files" "$out/bats.log" slicer_bats
fi

# 4. figure 3t with the GPU backend against the CPU one, same run
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
	say "SKIP: flexfs-bench (needs /usr/bin/python3 with torch and numpy)"
else
	FLEXFS_BIN=$build/fs/flexfs step "flexfs-bench --only transposed,gpu" \
		"$out/bench.log" timeout 360 "$root/tools/bench/flexfs-bench" \
		--only transposed,gpu --runs "${RUNS:-5}" --check all --no-torch26 \
		--json "$out/gpu.json"
	grep -E "^ *(transposed|gpu)|gpu run|skipped" "$out/bench.log" |
		tail -12 >>"$out/summary.txt"
fi
exit "$status"
