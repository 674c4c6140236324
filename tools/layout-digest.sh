#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A refactor's proof that behaviour is unchanged: mount every fixture under
# tests/fixtures at tp 1/2/4 x pp 1/2 (and the mindspore/ view at tp2 pp2)
# with the given flexfs binary, and write per mount its `ls -lR` listing
# (sizes, modes, names; times left out) and the SHA-256 of every file, or
# the mount's refusal.  Run it with the binaries before and after a change
# and compare the two output folders with `diff -r`.
#   tools/layout-digest.sh BUILD_DIR OUT_DIR [FIXTURE_GLOB]
set -uo pipefail
build=$(cd "$1" && pwd)
out=$2
glob=${3:-*}
src=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/fs/flexfs
mkdir -p "$out"
mnt=$(mktemp -d /tmp/flexfs-digest.XXXXXX)
trap 'fusermount3 -u "$mnt" 2>/dev/null; rmdir "$mnt"' EXIT

one() { # name ckpt opts
	local name=$1 ck=$2 opts=$3 f=$out/$1.txt
	if ! "$bin" "$ck" "$mnt" -o "$opts" 2>"$f.err"; then
		{ echo "REFUSED: $opts"; sed "s|$src|SRC|g" "$f.err"; } >"$f"
		rm -f "$f.err"
		return
	fi
	rm -f "$f.err"
	{
		echo "OPTS: ${opts//$src/SRC}"
		(cd "$mnt" && ls -lR --time-style=+ . | sed -E 's/^([^ ]+ +)[0-9]+ /\1/')
		(cd "$mnt" && find . -type f | LC_ALL=C sort | xargs -r -d '\n' sha256sum)
	} >"$f" 2>&1
	fusermount3 -u "$mnt"
}

for d in "$src"/tests/fixtures/$glob/; do
	fx=$(basename "$d")
	ck=$d/ckpt
	[[ -d $ck ]] || continue
	# a PaddleFormers output directory: its checkpoint-N/
	for c in "$ck"/checkpoint-*/; do [[ -d $c ]] && ck=${c%/}; done
	# MindSpore: the strategy file beside the checkpoint
	extra=
	for s in "$d"/strategy/*; do [[ -f $s ]] && extra=",src_strategy=$s"; done
	for tp in 1 2 4; do
		for pp in 1 2; do
			one "${fx}_tp${tp}_pp${pp}" "$ck" "tp=$tp,pp=$pp$extra"
		done
	done
	one "${fx}_tp2_pp2_ms" "$ck" "tp=2,pp=2,mindspore$extra"
done
