#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Issue 18 item 6: flexfs-inspect --svg FILE draws which source files feed
# which target rank, per tensor group, scaled by bytes.  Checked against
# the plan's index.json (flexfs-inspect --json) and the checkpoint's files
# by tests/bats/lib/check_svg.py, and as headless Chromium shows it in a
# 1000 x 800 window by tests/bats/lib/check_png.py.

load helpers

setup() {
	setup_ff
	CHECK=$FLEXFS_SRC/tests/bats/lib/check_svg.py
}

teardown() {
	teardown_ff
}

# svg_ok DIR OPTS: the picture of DIR under OPTS, checked.
svg_ok() {
	local out=$BATS_TEST_TMPDIR/p.svg idx=$BATS_TEST_TMPDIR/index.json
	"$FLEXFS_INSPECT" "$1" -o "$2" --json >"$idx" 2>/dev/null
	run "$FLEXFS_INSPECT" "$1" -o "$2" --svg "$out"
	echo "$output"
	[ "$status" -eq 0 ]
	python3 "$CHECK" "$out" "$idx" "$1"
}

@test "svg: rank and file boxes, band bytes per rank equal index.json's (FSDP2 x TP, dcp-t26, Megatron stacked)" {
	svg_ok "$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt" tp=2,pp=2
	svg_ok "$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt" tp=1
	svg_ok "$FLEXFS_SRC/tests/fixtures/dcp-t26/ckpt" tp=1,pp=2
	svg_ok "$FLEXFS_SRC/tests/fixtures/megatron-tied/ckpt/iter_0000100" tp=2,pp=2
}

@test "svg: - writes to stdout, the same picture; an unwritable FILE fails with its name; undecided splits exit 1" {
	local ck=$FLEXFS_SRC/tests/fixtures/fsdp2-tp/ckpt
	"$FLEXFS_INSPECT" "$ck" -o tp=2 --svg "$BATS_TEST_TMPDIR/a.svg" 2>/dev/null
	"$FLEXFS_INSPECT" "$ck" -o tp=2 --svg - 2>/dev/null >"$BATS_TEST_TMPDIR/b.svg"
	cmp "$BATS_TEST_TMPDIR/a.svg" "$BATS_TEST_TMPDIR/b.svg"
	run --separate-stderr "$FLEXFS_INSPECT" "$ck" -o tp=2 --svg /nonexistent/x.svg
	[ "$status" -eq 1 ]
	[[ $stderr == *"/nonexistent/x.svg: No such file or directory"* ]]
	run --separate-stderr "$FLEXFS_INSPECT" "$ck" -o tp=2 --svg /dev/full
	[ "$status" -eq 1 ]
	[[ $stderr == *"/dev/full: --svg: Input/output error"* ]]
	# undecided splits: drawn replicated, listed, exit 1 (as the table)
	run --separate-stderr "$FLEXFS_INSPECT" "$FLEXFS_SRC/tests/fixtures/dcp-t26/ckpt" -o tp=2 --svg "$BATS_TEST_TMPDIR/u.svg"
	[ "$status" -eq 1 ]
	[[ $stderr == *"block.weight (saved along axes 0,1)"* ]]
	python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$BATS_TEST_TMPDIR/u.svg"
}

@test "svg: names with XML specials and bidi characters are escaped" {
	local ck=$BATS_TEST_TMPDIR/evil out=$BATS_TEST_TMPDIR/e.svg
	save_dcp "$ck" <<'PY'
{"a<&\"'b\u202ec.weight": torch.zeros(4), "plain": torch.ones(2)}
PY
	"$FLEXFS_INSPECT" "$ck" -o tp=1 --json >"$BATS_TEST_TMPDIR/index.json"
	run "$FLEXFS_INSPECT" "$ck" -o tp=1 --svg "$out"
	[ "$status" -eq 0 ]
	python3 "$FLEXFS_SRC/tests/bats/lib/check_svg.py" "$out" "$BATS_TEST_TMPDIR/index.json" "$ck"
	! grep -q $'\xe2\x80\xae' "$out"
	# the parsed text is the name, U+202E as flx_escape() writes it
	python3 - "$out" <<-'EOF2'
		import sys, xml.etree.ElementTree as ET
		texts = [t.text for t in ET.parse(sys.argv[1]).getroot().iter("{http://www.w3.org/2000/svg}text")]
		assert any(t.startswith("a<&\"'b%E2%80%AEc.weight: ") for t in texts), texts
	EOF2
}

# svg_png SVG PNG: headless Chromium's screenshot of SVG in a 1000 x 800
# window (tools/setup.sh --deps installs chromium).
svg_png() {
	command -v chromium >/dev/null ||
		{ echo "chromium not found: tools/setup.sh --deps installs it" >&2; return 1; }
	local prof
	prof=$(mktemp -d "$BATS_TEST_TMPDIR/chromium.XXXXXX")
	timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic \
		--no-first-run --disable-background-networking --disable-component-update \
		--disable-sync --user-data-dir="$prof" --screenshot="$2" \
		--window-size=1000,800 "file://$1" 3>&- >/dev/null 2>&1
	[ -s "$2" ]
}

@test "svg: distinct hues per group, legend and band labels visible in a 1000 x 800 window (headless Chromium screenshot)" {
	local ck=$FLEXFS_SRC/tests/fixtures/dcp-t26/ckpt out=$BATS_TEST_TMPDIR/p.svg
	"$FLEXFS_INSPECT" "$ck" -o tp=1,pp=2 --json >"$BATS_TEST_TMPDIR/index.json"
	"$FLEXFS_INSPECT" "$ck" -o tp=1,pp=2 --svg "$out"
	# 17 groups (wq, wo, w2, output among them): their hues apart
	run python3 "$CHECK" "$out" "$BATS_TEST_TMPDIR/index.json" "$ck"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *"ok: 17 groups, distinct hues"* ]]
	svg_png "$out" "$BATS_TEST_TMPDIR/p.png"
	run python3 "$FLEXFS_SRC/tests/bats/lib/check_png.py" "$BATS_TEST_TMPDIR/p.png" "$out"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "ok: 1000x800 screenshot shows every legend swatch" ]]
}
