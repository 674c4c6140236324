#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Memory and undefined-behaviour checking of the test suite (part of
# tools/test.sh; about 15 minutes on 2 cores):
#
#  1. build-asan (-DFLEXFS_SANITIZE=ON: ASan + UBSan, no recovery): ctest
#     runs the unit tests, the fuzz regressions and the end-to-end bats
#     files labelled "sanitized" (each source's daemon path, MPI, faults,
#     limits, races; tests/bats/bats.cmake) against the sanitized daemon,
#     with leak detection on.  A report
#     fails the test that caused it: unit tests by their exit status;
#     daemons through tests/bats/helpers.bash (each test's sanitizer
#     log_path is checked in teardown, as is every -f daemon's stderr, and a
#     mount whose daemon died is a failure).  The oracle's self-test (pure
#     Python, label "oracle") is left to tools/test.sh.
#  2. build-tsan (ThreadSanitizer): the case corpus with the items read on
#     threads, also beside the plan build (test_cases_threads/_async);
#     MindSpore's rank directories, rank files and tensors read in parts
#     on threads (test_mindspore);
#     readers sharing one block cache (test_bcache, test_view); readers
#     sharing the zstd window cache, pins held across reads (test_zcache).
#  3. valgrind memcheck on the normal build: tests/bats/valgrind.bats with
#     FLEXFS_EXEC_PREFIX, so the daemon, its startup error paths and
#     flexfs-inspect run under memcheck; an error or a definite leak makes
#     the process exit 99, which fails the test.
#
# Environment: FLEXFS_STRESS_SECONDS (reader time per fixture in
# stress.bats; 5 here), FLEXFS_NORMAL_BUILD (the build valgrind uses;
# default build, as tools/test.sh leaves it).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
normal=${FLEXFS_NORMAL_BUILD:-build}
export FLEXFS_STRESS_SECONDS=${FLEXFS_STRESS_SECONDS:-5}

if ! command -v valgrind >/dev/null; then
	if [[ $(id -u) -ne 0 ]]; then
		echo "test-sanitize: valgrind is missing (run as root to install)" >&2
		exit 1
	fi
	echo "test-sanitize: installing valgrind"
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends valgrind
fi

start=$SECONDS
echo "== ASan + UBSan build (build-asan)"
# (libflexfs-cuda.so is built once, by the normal build)
cmake -S . -B build-asan -DFLEXFS_SANITIZE=ON -DFLEXFS_WITH_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
# Every unit test and fuzz regression, and the end-to-end files labelled
# "sanitized" (tests/bats/bats.cmake says which and why); not the oracle's
# self-test nor the benchmark, which test no flexfs code of their own.
(
	cd build-asan
	names() { ctest -N "$@" | sed -n 's/^ *Test *#[0-9]*: //p' | sort; }
	skip=$(comm -23 <(names -L '^e2e$') <(names -L '^sanitized$') | paste -sd'|')
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		ctest --output-on-failure -j"$jobs" -LE '^(oracle|bench)$' \
			-E "^(${skip:-none})\$" --timeout 600
)
echo "== ASan + UBSan: passed in $((SECONDS - start)) s"

start=$SECONDS
echo "== TSan: item workers beside the plan build, readers sharing the block cache (build-tsan)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLEXFS_WITH_CUDA=OFF \
	-DCMAKE_C_FLAGS=-fsanitize=thread \
	-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build build-tsan -j"$jobs" --target test_cases test_bcache test_view \
	test_zcache test_mindspore
(
	cd build-tsan
	TSAN_OPTIONS=halt_on_error=1:exitcode=66 \
		ctest --output-on-failure \
		-R "^(test_cases|test_bcache$|test_view$|test_zcache$|test_mindspore$)" \
		--timeout 600
)
echo "== TSan: passed in $((SECONDS - start)) s"

start=$SECONDS
echo "== valgrind memcheck on the daemon ($normal, tests/bats/valgrind.bats)"
cmake -S . -B "$normal" >/dev/null
cmake --build "$normal" -j"$jobs"
# valgrind's own messages go to one log per process, not to the daemon's
# stderr, which the tests expect empty or exact: valgrind 3.19 does not know
# openat2() (system call 437) and says so once per process, while flexfs
# takes the component walk.  Any other message fails the run (memcheck
# errors and definite leaks also make the process exit 99).
vglog=$(mktemp -d)
trap 'rm -rf "$vglog"' EXIT
vg_check() {
	local f bad=0

	for f in "$vglog"/vg.*; do
		[[ -e $f ]] || continue
		if grep -v -e 'WARNING: unhandled amd64-linux syscall: 437$' \
			-e 'You may be able to write your own handler\.$' \
			-e 'Read the file README_MISSING_SYSCALL_OR_IOCTL\.$' \
			-e 'Nevertheless we consider this a bug\.  Please report$' \
			-e 'it at http://valgrind\.org/support/bug_reports\.html\.$' \
			"$f" | grep -q .; then
			echo "valgrind log $f:" >&2
			cat "$f" >&2
			bad=1
		fi
	done
	return "$bad"
}
if ! FLEXFS_SRC=$PWD \
	FLEXFS_BIN=$PWD/$normal/fs/flexfs \
	FLEXFS_INSPECT=$PWD/$normal/tools/flexfs-inspect \
	FLEXFS_EXEC_PREFIX="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --log-file=$vglog/vg.%p" \
	bats --tap tests/bats/valgrind.bats; then
	vg_check || true
	exit 1
fi
vg_check
echo "== valgrind: passed in $((SECONDS - start)) s"
