#!/bin/sh
# SPDX-License-Identifier: MIT
# check_dcp_digest.sh INSPECT FIXTURE: flexfs-inspect --digest of
# FIXTURE/ckpt (tp=1) gives exactly the tensors of FIXTURE/truth/digest.txt
# ("sha256 dtype shape fqn" per line, written from torch's own DCP load by
# tools/fixtures/gen_dcp_dtypes.py): same names, dtypes, shapes and bytes.
set -eu
inspect=$1
fix=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$inspect" "$fix/ckpt" -o tp=1 --digest >"$tmp/out" 2>"$tmp/err" || {
	cat "$tmp/err" >&2
	exit 1
}
awk '{print $1, $2, $3, $4}' "$tmp/out" | LC_ALL=C sort >"$tmp/got"
grep -v '^#' "$fix/truth/digest.txt" | LC_ALL=C sort >"$tmp/want"
[ -s "$tmp/want" ] || { echo "empty truth" >&2; exit 1; }
if ! diff -u "$tmp/want" "$tmp/got"; then
	echo "flexfs-inspect --digest differs from torch's load" >&2
	exit 1
fi
echo "ok: $(wc -l <"$tmp/want") tensors equal torch's load"
