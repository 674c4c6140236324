#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Packs what tools/gpu-check.sh needs on a device machine that cannot
# build flexfs (no -dev packages there and no registry to fetch them):
#
#   tools/gpu-pack.sh PACK_DIR [BUILD_DIR]         (default build-gpu/)
#
# builds BUILD_DIR here with CUDA (Release, no MPI), then copies into
# PACK_DIR, in the build tree's layout so that gpu-check.sh runs it as a
# build directory:
#   fs/flexfs, tools/flexfs-inspect, tools/bench/flexfs-slice-bench,
#   tests/test_slice and
#   tests/libflx_stub_cuda.so, each binary with libflexfs-cuda.so beside
#   it (the daemon looks next to itself first, gpu/slice_load.c);
#   lib/: the shared libraries the binaries link that a bare CUDA image
#   may lack (gpu-check.sh puts them on LD_LIBRARY_PATH only when the
#   loader finds none);
#   bin/fusermount3 for the mounts, and bats/: bats-core (bin/bats,
#   lib/bats-core, libexec/bats-core) for the bats step.
# PACK_DIR must be ignored by git (.git/info/exclude) to travel as a
# carried path.  Then, on the device machine:
#   OUT=... tools/gpu-check.sh PACK_DIR
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
pack=${1:?usage: gpu-pack.sh PACK_DIR [BUILD_DIR]}
build=$(realpath -m "${2:-$root/build-gpu}")

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
	-DFLEXFS_WITH_MPI=OFF -DFLEXFS_WITH_CUDA=ON >/dev/null
grep -q "^FLEXFS_WITH_CUDA:BOOL=ON" "$build/CMakeCache.txt" ||
	{ echo "gpu-pack: CMake found no CUDA toolkit" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target flexfs flexfs-inspect \
	test_slice flx_stub_cuda flexfs-cuda flexfs-slice-bench >/dev/null

rm -rf "$pack"
mkdir -p "$pack"/{fs,tools/bench,tests,lib,bin}
cp "$build/fs/flexfs" "$pack/fs/"
cp "$build/tools/flexfs-inspect" "$pack/tools/"
cp "$build/tools/bench/flexfs-slice-bench" "$pack/tools/bench/"
cp "$build/tests/test_slice" "$build/tests/libflx_stub_cuda.so" "$pack/tests/"
for d in fs tools tools/bench tests; do
	cp "$build/gpu/libflexfs-cuda.so" "$pack/$d/"
done

# every library the binaries link but the C library's own
for bin in "$pack"/fs/flexfs "$pack"/tools/flexfs-inspect \
	"$pack"/tests/test_slice; do
	ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -e '/libc\.so' -e '/libm\.so' -e '/ld-linux' |
	while read -r so; do cp -L "$so" "$pack/lib/"; done

cp "$(command -v fusermount3)" "$pack/bin/"
bats=$(readlink -f "$(command -v bats)")
bats_root=$(dirname "$(dirname "$bats")")
mkdir -p "$pack/bats/bin" "$pack/bats/lib" "$pack/bats/libexec"
cp "$bats" "$pack/bats/bin/bats"
cp -r "$bats_root/lib/bats-core" "$pack/bats/lib/"
cp -r "$bats_root/libexec/bats-core" "$pack/bats/libexec/"
du -sh "$pack"
