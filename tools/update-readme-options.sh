#!/bin/sh
# SPDX-License-Identifier: MIT
# Rewrite README.md's option table (between <!-- options:begin --> and
# <!-- options:end -->) from the option tables: flexfs-optdoc markdown.
# Usage: tools/update-readme-options.sh [BUILDDIR]  (default: build)
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$build/tools/flexfs-optdoc" markdown >"$tmp"
awk -v gen="$tmp" '
/^<!-- options:begin -->$/ { print; while ((getline l < gen) > 0) print l; skip = 1; next }
/^<!-- options:end -->$/ { skip = 0 }
!skip { print }' README.md >README.md.new
mv README.md.new README.md
