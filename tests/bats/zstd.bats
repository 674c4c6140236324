#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# zstd-transformed DCP items (torch >= 2.7's ZStandard extension, issue #21):
# every view of the dcp-zstd-* fixtures through the real mount, bit for bit
# against their truth (lib/check_views.py), concurrent readers of one item
# through a small cache, and the corrupt frames of dcp-zstd-bad refused at
# mount, naming the item.

load helpers

ZFX=$FLEXFS_SRC/tests/fixtures

setup() {
	setup_ff
	# mini, edge and big hold no tensor that needs tests/fixtures/rules.json
	# (whose rule for block.weight would match nothing: a warning)
	NORULES=$BATS_TEST_TMPDIR/norules.json
	echo '[]' >"$NORULES"
}

teardown() {
	teardown_ff
}

@test "dcp-zstd-mini: views at tp 1/2/4 x pp 1/2 equal the truth" {
	for tp in 1 2 4; do
		for pp in 1 2; do
			RULES=$NORULES check_views_mount dcp-zstd-mini "$tp" "$pp"
		done
	done
}

# The larger fixtures: two points of the matrix each by default, all six
# with FLEXFS_ZSTD_FULL=1 (about a minute more on two cores).
zstd_matrix() {
	local fx=$1 tp pp
	if [[ ${FLEXFS_ZSTD_FULL:-0} == 1 ]]; then
		for tp in 1 2 4; do
			for pp in 1 2; do
				check_views_mount "$fx" "$tp" "$pp"
			done
		done
	else
		check_views_mount "$fx" 2 2
		check_views_mount "$fx" 4 1
	fi
}

@test "dcp-zstd-mixed (compressed and plain ranks): views equal the truth" {
	zstd_matrix dcp-zstd-mixed
}

@test "dcp-zstd-t26 (every dtype, transposed, 0-d, empty): views equal the truth" {
	zstd_matrix dcp-zstd-t26
}

@test "dcp-zstd-edge: frames with content size and checksum, descriptor 1.1" {
	RULES=$NORULES check_views_mount dcp-zstd-edge/frameflags 2 2
	RULES=$NORULES check_views_mount dcp-zstd-edge/v1minor 4 1
}

# big.weight / big.table: multi-window items (2-3 MiB of content each), the
# truth computed by the generator's formula.  4 checkers at once on a
# mount whose cache holds a window or two (5M: windows are 2 MiB and a
# block, zcache.h): readers of one item share and
# restart its streams, and every byte still equals the truth.
@test "dcp-zstd-big: views, then 4 concurrent checkers, 1-window cache" {
	local truth=$BATS_TEST_TMPDIR/truth pids=() i tps=2 pps=2
	local RULES=$NORULES
	[[ ${FLEXFS_ZSTD_FULL:-0} != 1 ]] || { tps="1 2 4"; pps="1 2"; }
	/usr/bin/python3 "$FLEXFS_SRC/tools/fixtures/gen_zstd.py" truth \
		--fixture "$ZFX/dcp-zstd-big" --out "$truth"
	for tp in $tps; do
		for pp in $pps; do
			mount_ff "$ZFX/dcp-zstd-big/ckpt" "$MNT" \
				"tp=$tp,pp=$pp,rules=$RULES"
			run /usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/check_views.py" \
				-q --mount "$MNT" --truth "$truth" --tp "$tp" --pp "$pp" \
				--rules "$RULES"
			echo "$output"
			[[ $output == *" passed, 0 failed"* ]]
			unmount_ff "$MNT"
		done
	done
	mount_ff "$ZFX/dcp-zstd-big/ckpt" "$MNT" "tp=2,pp=1,rules=$RULES,cache_size=5M"
	for i in 1 2 3 4; do
		/usr/bin/python3 "$FLEXFS_SRC/tests/bats/lib/check_views.py" -q \
			--mount "$MNT" --truth "$truth" --tp 2 --pp 1 --rules "$RULES" \
			>"$BATS_TEST_TMPDIR/check.$i" 2>&1 3>&- &
		pids+=($!)
	done
	for i in 1 2 3 4; do
		wait "${pids[$((i - 1))]}" || { cat "$BATS_TEST_TMPDIR/check.$i"; false; }
		grep -q " passed, 0 failed" "$BATS_TEST_TMPDIR/check.$i"
	done
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	ff_quiet
}

# Each case of dcp-zstd-bad has one fault in norm.weight's item (rank 3):
# the mount is refused in one line naming that item and key, before any
# byte is served.  payload: a flipped byte that only the zip's CRC-32 sees
# (torch 2.7 loads it silently).
@test "dcp-zstd-bad: corrupt frames and unknown descriptors refused at mount" {
	local c want
	for c in checksum payload truncated truncated-tail fcs-small fcs-large \
		bomb \
		desc-lz4 desc-v2 desc-noversion; do
		case $c in
		desc-*) want='.metadata: norm.weight: item transform' ;;
		checksum) want='__3_0.distcp@593: norm.weight: zstd frame is corrupt' ;;
		payload) want="__3_0.distcp@593: norm.weight: storage record's CRC-32" ;;
		truncated*) want='__3_0.distcp@593: norm.weight: zstd frame is incomplete' ;;
		fcs-*) want='__3_0.distcp@593: norm.weight: zstd frame is corrupt' ;;
		bomb) want='__3_0.distcp@593: norm.weight: zstd frame decompresses to more than' ;;
		esac
		echo "$c:"
		mount_refused_line "$ZFX/dcp-zstd-bad/$c/ckpt" "" "*$want*"
		[ "$status" -eq 1 ]
	done
}

# The bomb's frame holds 256 MiB of zeros after the item: the mount decodes
# it with bounded memory (a head, a tail and a count, zstditem.h) and stops
# at the item's bound, so the refused daemon's peak RSS stays within 64 MiB
# of that of a daemon refusing a small corrupt frame (checksum), far below
# what keeping the output would take.
@test "dcp-zstd-bad/bomb: refused within bounded memory (peak RSS)" {
	run /usr/bin/python3 - "$FLEXFS_BIN" "$ZFX/dcp-zstd-bad" "$MNT" <<'PY'
import os, resource, subprocess, sys
flexfs, bad, mnt = sys.argv[1:]
def refused(case):
    r = subprocess.run([flexfs, os.path.join(bad, case, "ckpt"), mnt, "-f"],
                       capture_output=True, text=True)
    # KiB; a process's children are waited for one by one, so the max is
    # the child's own once it exceeds the ones before
    return r, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
r0, base = refused("checksum")
r, rss = refused("bomb")
print(r.returncode, base, rss, r.stderr.strip())
sys.exit(0 if r0.returncode != 0 and r.returncode != 0 and
         rss < base + (64 << 10) and
         "decompresses to more than" in r.stderr else 1)
PY
	echo "$output"
	[ "$status" -eq 0 ]
	! mountpoint -q "$MNT"
}

# A backing file changed after mount, under files already open: reads are
# EIO, also of the windows the cache already holds (direct_io, so that
# every read reaches the daemon); opening again is ESTALE as for any view.
@test "zstd: a .distcp changed after mount is EIO, cached windows included" {
	local ck=$BATS_TEST_TMPDIR/ck
	cp -a "$ZFX/dcp-zstd-mini/ckpt" "$ck"
	mount_ff "$ck" "$MNT" "tp=1,direct_io"
	run /usr/bin/python3 - "$MNT" "$ck" <<'PY'
import errno, os, sys
mnt, ck = sys.argv[1:]
fds = [os.open(os.path.join(mnt, p), os.O_RDONLY)
       for p in ("hf/model.safetensors", "objects/extra.step.pt")]
before = [os.pread(fd, 1 << 20, 0) for fd in fds]
assert all(before)
for n in ("__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"):
    with open(os.path.join(ck, n), "ab") as f:
        f.write(b"x")
for fd in fds:
    try:
        os.pread(fd, 1 << 20, 0)
        print("read after the change succeeded")
        sys.exit(1)
    except OSError as e:
        assert e.errno == errno.EIO, e
print("ok")
PY
	echo "$output"
	[ "$status" -eq 0 ]
	unmount_ff "$MNT"
}
