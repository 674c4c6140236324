#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run one libFuzzer campaign and fold what it found back into the committed
# corpus (minimized with -merge=1).  Needs a build made with
#   CC=clang cmake -S . -B build-fuzz -DFLEXFS_FUZZ=ON -DFLEXFS_SANITIZE=ON -DFLEXFS_WITH_FUSE=OFF
# Usage: tests/fuzz/campaign.sh TARGET SECONDS [extra libFuzzer flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
t=$1 secs=$2
shift 2
bin=build-fuzz/tests/fuzz_$t
work=${FLX_FUZZ_WORK:-/tmp/fuzzwork}/$t
art=${FLX_FUZZ_ARTIFACTS:-/tmp/fuzz-artifacts}
mkdir -p "$work" "$art"
cp -n tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
"$bin" "$work" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
	-artifact_prefix="$art/$t-" -print_final_stats=1 "$@"
# keep only inputs that add coverage
mkdir -p "$work.min"
"$bin" -merge=1 "$work.min" tests/fuzz/corpus/"$t" "$work" >/dev/null 2>&1
cp -n "$work.min"/* tests/fuzz/corpus/"$t"/ 2>/dev/null || true
echo "corpus $t: $(ls tests/fuzz/corpus/$t | wc -l) files"
