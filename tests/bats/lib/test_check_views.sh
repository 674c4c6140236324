#!/bin/sh
# Self-test of check_views.py (see test_check_views.py): a correct fake
# mount must pass and every injected defect must be reported.
#
#   tests/bats/lib/test_check_views.sh            # /usr/bin/python3 (numpy 1.x)
#   FLX_TRIXIE=/opt/trixie tests/bats/lib/test_check_views.sh
#       also runs it inside that Debian trixie chroot (numpy 2.x, torch 2.6)
#       with --real-safetensors; needs root.  Files are copied to
#       $FLX_TRIXIE/tmp/flexfs-check-views.$$ and removed afterwards.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
fixtures=$(cd "$here/../../fixtures" && pwd)
py=${FLX_PYTHON:-/usr/bin/python3}

"$py" "$here/test_check_views.py" --fixtures "$fixtures"

if [ -n "${FLX_TRIXIE:-}" ]; then
	rel=tmp/flexfs-check-views.$$
	dst=$FLX_TRIXIE/$rel
	trap 'rm -rf "$dst"' EXIT
	mkdir -p "$dst/tests/bats/lib" "$dst/tests/fixtures"
	cp "$here/check_views.py" "$here/test_check_views.py" "$dst/tests/bats/lib/"
	cp -a "$fixtures/dcp-t113" "$fixtures/dcp-t26" "$fixtures/rules.json" \
		"$dst/tests/fixtures/"
	chroot "$FLX_TRIXIE" python3 "/$rel/tests/bats/lib/test_check_views.py" \
		--fixtures "/$rel/tests/fixtures" --real-safetensors
fi
