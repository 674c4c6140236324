#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build and run the whole test suite: the core without FUSE (unit tests),
# then the full build (unit + end-to-end mounts through bats).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --deps
jobs=$(nproc)

tools/check-format.sh

echo "== core without FUSE or CUDA (Release: -O3 warnings are errors too)"
cmake -S . -B build-nofuse -DFLEXFS_WITH_FUSE=OFF -DFLEXFS_WITH_CUDA=OFF \
	-DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-nofuse -j"$jobs"
(cd build-nofuse && ctest --output-on-failure -j"$jobs")

echo "== full build"
cmake -S . -B build >/dev/null
cmake --build build -j"$jobs"
# what the core-only build could not run: the end-to-end files, the
# benchmark's quick run and the tests whose content depends on the build's
# features (label "features"); the unit tests ran above.  Two at a time:
# every end-to-end file mounts on its own temporary directories.
(cd build && ctest --output-on-failure -j"$jobs" -L '^(e2e|bench|features)$')

echo "== sanitizers (ASan + UBSan) and valgrind"
tools/test-sanitize.sh
