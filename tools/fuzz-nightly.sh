#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Nightly fuzzing (not run by CI): every libFuzzer target for SECONDS each
# (default 600, the issue's floor), one after the other, each through
# tests/fuzz/campaign.sh (a working copy of its corpus, crashes to the
# artifacts directory, new coverage merged back into tests/fuzz/corpus/).
# Builds build-fuzz with clang + ASan/UBSan first if it is missing.
#
# Records per target: executions, executions per second, libFuzzer's edge
# coverage (cov) and features (ft) at the end, corpus size before and
# after the merge, and crashes/timeouts/OOMs (artifacts).  The table goes
# to OUT/summary.md (OUT: $FLX_FUZZ_OUT, default /tmp/fuzz-nightly/<UTC
# date-time>), the logs beside it; docs/reliability.md keeps the results.
# Exits 1 when any target left an artifact.
#
# Usage: tools/fuzz-nightly.sh [SECONDS [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
shift || true
targets=("$@")
# default: every target tests/fuzz/fuzz.cmake lists (flx_fuzz_targets)
((${#targets[@]})) ||
	read -ra targets <<<"$(awk '/^(set|list)\((APPEND )?flx_fuzz_targets/ { on = 1 }
		on { sub(/.*flx_fuzz_targets/, ""); t = t " " $0 }
		on && /\)/ { on = 0 }
		END { gsub(/\)/, "", t); print t }' tests/fuzz/fuzz.cmake)"
out=${FLX_FUZZ_OUT:-/tmp/fuzz-nightly/$(date -u +%Y%m%dT%H%M%SZ)}
art=$out/artifacts
mkdir -p "$out" "$art"

if [[ ! -x build-fuzz/tests/fuzz_${targets[0]} ]]; then
	CC=${CC:-clang} cmake -S . -B build-fuzz -DFLEXFS_FUZZ=ON \
		-DFLEXFS_SANITIZE=ON -DFLEXFS_WITH_FUSE=OFF >"$out/build.log"
fi
cmake --build build-fuzz -j"${FLX_FUZZ_JOBS:-2}" \
	--target "${targets[@]/#/fuzz_}" >>"$out/build.log"

{
	echo "| target | seconds | executions | exec/s | cov | ft | corpus before -> after | artifacts |"
	echo "|---|---|---|---|---|---|---|---|"
} >"$out/summary.md"
found=0
for t in "${targets[@]}"; do
	before=$(ls "tests/fuzz/corpus/$t" | wc -l)
	log=$out/$t.log
	FLX_FUZZ_WORK=$out/work FLX_FUZZ_ARTIFACTS=$art \
		tests/fuzz/campaign.sh "$t" "$secs" >"$log" 2>&1 || true
	after=$(ls "tests/fuzz/corpus/$t" | wc -l)
	# the last status line: "#N DONE cov: C ft: F corp: ..." (or the
	# last pulse when it stopped on a crash)
	last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
	execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" |
		grep -oE '[0-9]+$' || echo "${last%% *}")
	eps=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" |
		grep -oE '[0-9]+$' || echo "?")
	cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo "?")
	ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo "?")
	n=$(find "$art" -name "$t-*" | wc -l)
	((n == 0)) || found=1
	echo "| $t | $secs | ${execs#\#} | $eps | $cov | $ft | $before -> $after | $n |" \
		>>"$out/summary.md"
done
cat "$out/summary.md"
echo "logs and artifacts: $out"
exit "$found"
