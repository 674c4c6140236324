#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fail if any C source differs from the committed .clang-format style
# (generated test vectors excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.c' '*.h' | grep -v '^tests/unit/data/')
# shellcheck disable=SC2086
clang-format --dry-run --Werror $files
echo "format: ok"
