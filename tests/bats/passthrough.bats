#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# -o passthrough: a view file that is the whole of one backing file, byte
# for byte, is read by the kernel from that file (FUSE passthrough); every
# other file is served by the daemon as without the option.  The checkpoint
# that qualifies is a Hugging Face one flexfs wrote itself: hf-tiny/single's
# hf/ copied out (its model.safetensors has flexfs's header, which hf/ of a
# mount of the copy reproduces; config.json and tokenizer.json are served
# verbatim).  hf-tiny/single itself, written by the safetensors library,
# has another header: its hf/model.safetensors never qualifies.  What the
# daemon served is read from its own counters (FLEXFS_FUSE_STATS=1: READ
# requests, opens, opens answered passthrough, printed at exit); the bytes
# are checked with cmp against the backing files, through mmap, and by
# lib/check_views.py against the original tensors.  Skipped, with the
# daemon's reason, where the kernel cannot (Linux < 6.9, no
# CONFIG_FUSE_PASSTHROUGH, no CAP_SYS_ADMIN).

load helpers

HF=$FLEXFS_SRC/tests/fixtures/hf-tiny
HF_RULES=$HF/rules.json
CHECK=$FLEXFS_SRC/tests/bats/lib/check_views.py

setup() {
	setup_ff
	export FLEXFS_FUSE_STATS=1
	OWN=$BATS_TEST_TMPDIR/own
}

teardown() {
	local inner=$BATS_TEST_TMPDIR/inner

	[[ -z $(mountinfo_of "$inner") ]] || fusermount3 -u "$inner"
	teardown_ff
}

# own_hf: OWN = hf-tiny/single's hf/ view copied out (flexfs's writer).
own_hf() {
	mkdir -p "$OWN"
	mount_ff "$HF/single" "$MNT" ""
	cp "$MNT"/hf/* "$OWN"/
	unmount_ff "$MNT"
	[ "$(ls "$OWN" | tr '\n' ' ')" = "config.json model.safetensors tokenizer.json " ]
}

# mount_pass SRC OPTS [MNT]: mount SRC at MNT ($MNT) with -o
# passthrough,OPTS; skip with the daemon's reason when it could not apply
# passthrough.
mount_pass() {
	local mnt=${3:-$MNT} why

	mount_ff "$1" "$mnt" "passthrough${2:+,$2}"
	stat "$mnt/index.json" >/dev/null # INIT is answered
	if grep -q "passthrough not applied: " "$FF_ERR"; then
		why=$(grep "passthrough not applied: " "$FF_ERR")
		unmount_ff "$mnt"
		skip "${why#*not applied: }"
	fi
}

# stats_of: after unmount, the daemon's counters as READS OPENS PASS; its
# stderr held nothing else.  Skipped with the daemon's reason when the
# kernel refused passthrough at an open: for the mount (a namespace's
# CAP_SYS_ADMIN) or a file (this test's directory on a stacked filesystem,
# such as a container's overlayfs /tmp).
stats_of() {
	local line

	[ "$FF_RC" -eq 0 ]
	line=$(grep -E "passthrough not applied(: | to )" "$FF_ERR" || true)
	[[ -z $line ]] || skip "${line#flexfs: }"
	line=$(grep '^flexfs: fuse stats: ' "$FF_ERR")
	[[ $line =~ ^flexfs:\ fuse\ stats:\ reads\ ([0-9]+)\ opens\ ([0-9]+)\ passthrough\ ([0-9]+)\ mapped\ [0-9]+$ ]]
	READS=${BASH_REMATCH[1]}
	OPENS=${BASH_REMATCH[2]}
	PASS=${BASH_REMATCH[3]}
	echo "reads $READS opens $OPENS passthrough $PASS"
	[ "$(grep -v '^flexfs: fuse stats: ' "$FF_ERR" | grep -vcF "$FF_DTYPE_NOTE")" -eq 0 ]
}

# mmap_equal VIEW FILE: VIEW mapped (MAP_SHARED, read-only) equals FILE,
# also after a second open of VIEW kept open beside it is read().
mmap_equal() {
	/usr/bin/python3 -c '
import mmap, sys
view, path = sys.argv[1], sys.argv[2]
want = open(path, "rb").read()
with open(view, "rb") as a, open(view, "rb") as b:
    m = mmap.mmap(a.fileno(), 0, access=mmap.ACCESS_READ)
    assert m[:] == want, "mmap differs"
    assert b.read() == want, "read differs"
    assert m[len(want) // 3:len(want) // 2] == want[len(want) // 3:len(want) // 2]
    m.close()
with open(view, "rb") as c:
    assert c.read() == want, "re-open differs"
' "$1" "$2"
}

# hf_equal DIR: the mount's hf/ files are DIR's, by read() and by mmap.
hf_equal() {
	local f
	for f in config.json model.safetensors tokenizer.json; do
		cmp "$1/$f" "$MNT/hf/$f"
		mmap_equal "$MNT/hf/$f" "$1/$f"
	done
}

@test "passthrough: hf/ of a checkpoint flexfs wrote is its files, by read() and mmap, and the daemon serves no READ" {
	own_hf
	mount_pass "$OWN" "tp=2,rules=$HF_RULES"
	hf_equal "$OWN"
	unmount_ff "$MNT"
	stats_of
	[ "$READS" -eq 0 ]
	[ "$PASS" -eq "$OPENS" ]
	[ "$PASS" -ge 12 ] # 4 opens of each of the 3 files
}

@test "passthrough: without the option the same files are served by the daemon" {
	own_hf
	mount_ff "$OWN" "$MNT" "tp=2,rules=$HF_RULES"
	hf_equal "$OWN"
	unmount_ff "$MNT"
	stats_of
	[ "$READS" -gt 0 ]
	[ "$PASS" -eq 0 ]
}

@test "passthrough: every view of the mount is bit-exact; ranks/ files are served by the daemon" {
	own_hf
	mount_pass "$OWN" "tp=2,rules=$HF_RULES"
	run /usr/bin/python3 "$CHECK" -q --mount "$MNT" --truth "$HF/truth" \
		--tp 2 --pp 1 --rules "$HF_RULES"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == *" passed, 0 failed"* ]]
	unmount_ff "$MNT"
	stats_of
	[ "$READS" -gt 0 ]
	# ranks/ alone: every open served by the daemon
	mount_pass "$OWN" "tp=2,rules=$HF_RULES"
	cat "$MNT"/ranks/*/model.safetensors >/dev/null
	mmap_equal "$MNT/ranks/tp01_pp00/model.safetensors" \
		"$MNT/ranks/tp01_pp00/model.safetensors"
	unmount_ff "$MNT"
	stats_of
	[ "$READS" -gt 0 ]
	[ "$OPENS" -ge 4 ]
	[ "$PASS" -eq 0 ]
}

@test "passthrough: a file that is not its backing file byte for byte never is passed through" {
	# the safetensors library's header: hf/model.safetensors is flexfs's
	mount_pass "$HF/single" "tp=2,rules=$HF_RULES"
	cat "$MNT/hf/model.safetensors" "$MNT/index.json" >/dev/null
	[ "$(stat -c %s "$MNT/hf/model.safetensors")" -ne "$(stat -c %s "$HF/single/model.safetensors")" ]
	unmount_ff "$MNT"
	stats_of
	[ "$OPENS" -eq 2 ]
	[ "$PASS" -eq 0 ]
	[ "$READS" -gt 0 ]
	# flexfs's own checkpoint with a space moved to the header's front:
	# the same size and data offsets, another header
	own_hf
	/usr/bin/python3 -c '
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
assert b[8:9] == b"{" and b[8 + n - 1:8 + n] == b" "
b[9:8 + n] = b" " + b[9:8 + n - 1]
open(p, "wb").write(b)' "$OWN/model.safetensors"
	mount_pass "$OWN" "tp=1"
	cmp <(tail -c +"$(($(stat -c %s "$OWN/model.safetensors") - 1000))" "$OWN/model.safetensors") \
		<(tail -c +"$(($(stat -c %s "$OWN/model.safetensors") - 1000))" "$MNT/hf/model.safetensors")
	! cmp -s "$OWN/model.safetensors" "$MNT/hf/model.safetensors"
	cat "$MNT/hf/config.json" >/dev/null
	unmount_ff "$MNT"
	stats_of
	[ "$OPENS" -eq 3 ]
	[ "$PASS" -eq 1 ] # config.json only
}

@test "passthrough: the open still refuses a backing file changed since mount" {
	own_hf
	mount_pass "$OWN" "tp=2,rules=$HF_RULES"
	cmp "$OWN/model.safetensors" "$MNT/hf/model.safetensors"
	touch -d '2001-01-01' "$OWN/model.safetensors"
	run cat "$MNT/hf/model.safetensors"
	[ "$status" -ne 0 ]
	[[ $output == *"Stale file handle"* ]]
	unmount_ff "$MNT"
	[ "$FF_RC" -eq 0 ]
	grep -q "hf/model.safetensors: open failed: Stale file handle" "$FF_ERR"
}

@test "passthrough: a backing file the kernel will not register is served by the daemon, with one line" {
	# backing files on a passthrough mount (stack depth 1 already): the
	# kernel refuses to stack another one over them (ELOOP)
	local inner=$BATS_TEST_TMPDIR/inner inner_pid inner_err
	mkdir -p "$inner"
	mount_pass "$HF/single" "" "$inner"
	inner_pid=$FF_PID inner_err=$FF_ERR
	mount_pass "$inner/hf" ""
	hf_equal "$inner/hf"
	unmount_ff "$MNT"
	[ "$(grep -c 'passthrough not applied to hf/' "$FF_ERR")" -eq 1 ]
	grep -q "(Too many levels of symbolic links); served by the daemon" "$FF_ERR"
	sed -i '/passthrough not applied to hf\//d' "$FF_ERR"
	stats_of
	[ "$PASS" -eq 0 ]
	[ "$READS" -gt 0 ]
	# the inner mount served the outer daemon's reads of its verbatim
	# files by passthrough
	FF_PID=$inner_pid FF_ERR=$inner_err
	unmount_ff "$inner"
	stats_of
	[ "$PASS" -gt 0 ]
}

@test "passthrough: opens, reads, maps and closes of the same files from 8 threads race the backing id's life, and every byte is right" {
	own_hf
	mount_pass "$OWN" ""
	run /usr/bin/python3 -c '
import mmap, sys, threading
mnt, own = sys.argv[1], sys.argv[2]
names = ("model.safetensors", "config.json")
want = {f: open(own + "/" + f, "rb").read() for f in names}
errs = []
def worker(k):
    for i in range(300):
        f = names[(i + k) % 3 == 0]
        try:
            with open(mnt + "/hf/" + f, "rb") as h:
                if i % 2:
                    m = mmap.mmap(h.fileno(), 0, access=mmap.ACCESS_READ)
                    ok = m[:] == want[f]
                    m.close()
                else:
                    ok = h.read() == want[f]
            if not ok:
                errs.append("%d %d %s: other bytes" % (k, i, f))
        except OSError as e:
            errs.append("%d %d %s: %s" % (k, i, f, e))
ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("%d errors" % len(errs), errs[:5])
' "$MNT" "$OWN"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ $output == "0 errors []" ]]
	unmount_ff "$MNT"
	stats_of
	[ "$OPENS" -eq 2400 ]
	[ "$PASS" -eq 2400 ]
	[ "$READS" -eq 0 ]
}
