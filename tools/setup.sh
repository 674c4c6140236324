#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install what is missing (Debian 12, as root), build flexfs, and run the
# main job on the bundled example checkpoint (tools/demo.sh).
#   tools/setup.sh            install + build + demo
#   tools/setup.sh --deps     install only (idempotent; used by tests and CI)
set -euo pipefail
cd "$(dirname "$0")/.."

# Build: compiler, CMake, pkg-config, the libraries flexfs links (zlib for
# zip CRCs, libcrypto for the tools' SHA-256).
# Run/test: fuse3 (fusermount3, mount.fuse3), bats, numpy and torch for the
# oracle checks (real loaders read the views back).  OpenMPI and xxhash for
# the distributed mount and the materializer; protobuf-c (library and
# protoc-c, required by the build) for MindSpore's strategy files.
# chromium: tests/bats/svg.bats takes a headless screenshot of --svg.
PKGS=(build-essential cmake pkg-config libfuse3-dev fuse3 libjansson-dev
      libzstd-dev zlib1g-dev libssl-dev bats clang-format python3 python3-numpy python3-torch
      python3-zstandard python3-protobuf protobuf-compiler util-linux valgrind
      openmpi-bin libopenmpi-dev libxxhash-dev libprotobuf-c-dev
      protobuf-c-compiler chromium)

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing+=("$p")
done
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "setup: missing packages: ${missing[*]} (run as root to install)" >&2
		exit 1
	fi
	echo "setup: installing ${missing[*]}"
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[[ ${1:-} == --deps ]] && exit 0

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
exec tools/demo.sh
