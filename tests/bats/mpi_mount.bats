#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# The distributed mount (-o mpi, resolver/remote/mpi_mount.h): N ranks of mpirun on this
# machine, each with its own directory holding part of the checkpoint; every
# rank's tree must equal a single-machine mount of the whole checkpoint.
# mpirun runs with --enable-recovery (DM_RECOVERY) so that a killed rank
# leaves the others running (otherwise mpirun itself ends them all).

load helpers

TIMEOUT=3 # -o mpi_timeout: seconds a read waits for a dead rank
# the MindSpore checkpoint and the option naming its strategy
MS=$FLEXFS_SRC/tests/fixtures/mindspore-tp2dp2
MS_ST=src_strategy=$MS/strategy/ckpt_strategy_rank_0.ckpt

setup() {
	[[ ${FLEXFS_MPI:-OFF} == ON ]] ||
		skip "flexfs built without MPI (FLEXFS_WITH_MPI=OFF)"
	command -v mpirun >/dev/null || skip "mpirun not found"
	require_fuse
	setup_ff
	# Under ASan (tools/test-sanitize.sh) the daemons run without leak
	# detection: OpenMPI's components allocate at MPI_Init and are
	# unloaded at MPI_Finalize, so LSan reports their blocks with no
	# module to suppress them by (as materialize.bats); every other
	# mount test runs the same read path with leak checks.
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
	T=$BATS_TEST_TMPDIR
	SRC=$FLEXFS_SRC/tests/fixtures/dcp-t113/ckpt
	DM_PID=
	DM_NP=0
	DM_STOPPED=
	DM_RECOVERY=--enable-recovery
}

teardown() {
	local r

	[[ -z $DM_STOPPED ]] || kill -CONT "$DM_STOPPED" 2>/dev/null || true
	for ((r = 0; r < DM_NP; r++)); do
		[[ -n $(mountinfo_of "$T/mnt$r") ]] || continue
		fusermount3 -u -z "$T/mnt$r" 2>/dev/null || umount -l "$T/mnt$r"
	done
	if [[ -n $DM_PID ]] && ! wait_gone "$DM_PID" 100; then
		kill -TERM "$DM_PID" 2>/dev/null || true
	fi
	teardown_ff
}

# dm_dirs NP: the empty $T/src0..NP-1 and $T/mnt0..NP-1.
dm_dirs() {
	local r

	for ((r = 0; r < $1; r++)); do
		mkdir -p "$T/src$r" "$T/mnt$r"
	done
}

# split NP LAYOUT: the fixture's files over $T/src0..NP-1.  spread: file i
# on rank i % NP only (no rank holds everything), .metadata on rank 0;
# twice: file i on ranks i % NP and (i + 1) % NP, .metadata on the last
# rank only.
split() {
	local np=$1 layout=$2 i=0 f
	local -a files

	dm_dirs "$np"
	mapfile -t files < <(cd "$SRC" && ls -A | grep -vx .metadata)
	if [[ $layout == spread ]]; then
		cp -p "$SRC/.metadata" "$T/src0/"
	else
		cp -p "$SRC/.metadata" "$T/src$((np - 1))/"
	fi
	for f in "${files[@]}"; do
		cp -p "$SRC/$f" "$T/src$((i % np))/"
		[[ $layout == spread ]] ||
			cp -p "$SRC/$f" "$T/src$(((i + 1) % np))/"
		i=$((i + 1))
	done
}

# spread_entries NP: the fixture's top-level entries (files and whole
# subdirectories such as MindSpore's rank_N/) over $T/src0..NP-1, entry i
# on rank i % NP.
spread_entries() {
	local np=$1 i=0 f

	dm_dirs "$np"
	while IFS= read -r f; do
		cp -rp "$SRC/$f" "$T/src$((i % np))/"
		i=$((i + 1))
	done < <(cd "$SRC" && ls -A)
}

# spread_files NP: every file of the fixture, at any depth, over
# $T/src0..NP-1 (file i in find's sorted order on rank i % NP), its
# subdirectories made where it goes: a directory split between ranks.
spread_files() {
	local np=$1 i=0 r f

	dm_dirs "$np"
	while IFS= read -r f; do
		r=$((i % np))
		mkdir -p "$T/src$r/$(dirname "$f")"
		cp -p "$SRC/$f" "$T/src$r/$f"
		i=$((i + 1))
	done < <(cd "$SRC" && find . -type f | sort)
}

# dm_start NP OPTS: mpirun NP daemons in the background (DM_PID, DM_LOG)
# and wait until every rank has mounted; fails with the log otherwise.
dm_start() {
	local np=$1 opts=$2 i r up

	DM_NP=$np
	DM_LOG=$T/mpirun.log
	# shellcheck disable=SC2086 # DM_RECOVERY: one option or none
	mpirun --oversubscribe --allow-run-as-root $DM_RECOVERY -np "$np" \
		"$FLEXFS_BIN" -f "$T/src{rank}" "$T/mnt{rank}" \
		-o "$opts,mpi,mpi_timeout=$TIMEOUT" >"$DM_LOG" 2>&1 3>&- &
	DM_PID=$!
	for ((i = 0; i < 200; i++)); do
		up=0
		for ((r = 0; r < np; r++)); do
			mountpoint -q "$T/mnt$r" && up=$((up + 1))
		done
		((up == np)) && return 0
		if ! kill -0 "$DM_PID" 2>/dev/null; then
			echo "mpirun exited before every rank mounted:" >&2
			cat "$DM_LOG" >&2
			return 1
		fi
		sleep 0.1
	done
	echo "not every rank mounted within 20 s:" >&2
	cat "$DM_LOG" >&2
	return 1
}

# dm_fails NP OPTS WANT: mpirun must end on its own, no rank mounted, and
# its log DM_LOG holds NP lines "flexfs: ...", NP of them matching the
# basic regex WANT (each rank one line, the same reason).
dm_fails() {
	local np=$1 opts=$2 want=$3 r

	DM_NP=$np
	DM_LOG=$T/mpirun.log
	run -0 timeout 60 bash -c 'mpirun --oversubscribe --allow-run-as-root \
		-np "$1" "$2" -f "$3/src{rank}" "$3/mnt{rank}" -o "$4,mpi" \
		>"$5" 2>&1 3>&-; echo "rc $?"' _ "$np" "$FLEXFS_BIN" "$T" \
		"$opts" "$DM_LOG"
	[[ $output != "rc 0" ]]
	for ((r = 0; r < np; r++)); do
		not_mounted "$T/mnt$r"
	done
	[[ $(grep -c "$want" "$DM_LOG") -eq $np ]]
	[[ $(grep -c "^flexfs: " "$DM_LOG") -eq $np ]]
}

# ref_mount OPTS: one mount of the whole checkpoint SRC on $T/ref.
ref_mount() {
	mkdir -p "$T/ref"
	mount_ff "$SRC" "$T/ref" "$1"
}

# same_as_ref NP OPTS: every rank's tree equals a single mount of the whole
# checkpoint with OPTS, byte for byte (index.json names its source
# directory: that line aside).
same_as_ref() {
	local np=$1 opts=$2 r

	ref_mount "$opts"
	for ((r = 0; r < np; r++)); do
		diff -r --exclude=index.json "$T/ref" "$T/mnt$r"
		diff <(grep -v '"dir":' "$T/ref/index.json") \
			<(grep -v '"dir":' "$T/mnt$r/index.json")
	done
	unmount_ff "$T/ref"
}

# dm_equal NP OPTS...: for each OPTS, NP ranks mounted with it equal one
# mount of the whole (same_as_ref), then stopped (dm_stop).
dm_equal() {
	local np=$1 opts

	shift
	for opts in "$@"; do
		dm_start "$np" "$opts"
		same_as_ref "$np" "$opts"
		dm_stop
	done
}

# dm_stop [RANK]: unmount rank RANK (default 0); every rank must end,
# mpirun with status 0.
dm_stop() {
	local r rc=0

	fusermount3 -u "$T/mnt${1:-0}"
	wait_gone "$DM_PID" 150
	wait "$DM_PID" || rc=$?
	DM_PID=
	for ((r = 0; r < DM_NP; r++)); do
		not_mounted "$T/mnt$r"
	done
	[[ $rc -eq 0 ]] || {
		cat "$DM_LOG" >&2
		return 1
	}
}

@test "2 ranks, no rank holds everything: each equals one mount (tp=2; tp=4,pp=2)" {
	split 2 spread
	[[ ! -e $T/src1/.metadata ]]
	dm_equal 2 "tp=2,rules=$RULES" "tp=4,pp=2,rules=$RULES"
}

@test "3 ranks, every file held twice, .metadata on the last: equal at tp=2,pp=2" {
	split 3 twice
	dm_equal 3 "tp=2,pp=2,rules=$RULES"
}

@test "4 ranks, spread: equal at tp=1 and reads of every rank's bytes" {
	split 4 spread
	dm_equal 4 "tp=1,rules=$RULES"
}

@test "zstd items (dcp-zstd-mini) over 2 ranks: equal at tp=2 and tp=4,pp=2" {
	SRC=$FLEXFS_SRC/tests/fixtures/dcp-zstd-mini/ckpt
	echo '[]' >"$T/norules.json"
	split 2 spread
	dm_equal 2 "tp=2,rules=$T/norules.json" "tp=4,pp=2,rules=$T/norules.json"
}

@test "tensors saved transposed (strided gathers of remote bytes) over 2 ranks" {
	gen_transposed "$T/tposed"
	SRC=$T/tposed/ckpt
	split 2 spread
	dm_equal 2 "tp=2,pp=2" "tp=4,pp=1"
}

@test "Megatron-Core torch_dist (common.pt and metadata.json on different ranks) over 2 ranks" {
	SRC=$FLEXFS_SRC/tests/fixtures/megatron-tied/ckpt/iter_0000100
	split 2 spread
	[[ -e $T/src1/common.pt && -e $T/src0/metadata.json ]] ||
		[[ -e $T/src0/common.pt && -e $T/src1/metadata.json ]]
	dm_equal 2 "tp=2"
}

@test "Paddle Flex Checkpoint (paddle-flex-p4) over 2 ranks: equal at tp=2 and tp=4" {
	SRC=$FLEXFS_SRC/tests/fixtures/paddle-flex-p4/ckpt
	spread_entries 2
	[[ -e $T/src0/0.metadata && ! -e $T/src1/0.metadata ]]
	dm_equal 2 "tp=2" "tp=4"
}

@test "Hugging Face safetensors (hf-tiny sharded and single) over 2 ranks: equal at tp=2" {
	SRC=$FLEXFS_SRC/tests/fixtures/hf-tiny/sharded
	spread_entries 2
	# the index and the shards it names on different ranks
	[[ -e $T/src0/model.safetensors.index.json &&
		-e $T/src1/model-00001-of-00003.safetensors ]]
	dm_equal 2 "tp=2"
	rm -rf "$T"/src*
	SRC=$FLEXFS_SRC/tests/fixtures/hf-tiny/single
	spread_entries 2
	[[ ! -e $T/src0/model.safetensors ]]
	dm_equal 2 "tp=2"
}

@test "MindSpore (mindspore-tp2dp2, rank_N/ subdirectories) over 2 ranks with its strategy: equal at tp=2 and tp=4" {
	SRC=$MS/ckpt
	spread_entries 2
	[[ -d $T/src0/rank_0 && -d $T/src1/rank_1 && ! -e $T/src0/rank_1 ]]
	dm_equal 2 "tp=2,$MS_ST" "tp=4,$MS_ST"
}

@test "PaddleFormers checkpoint-N: its model_state/ and optimizer_state/ split file by file over 3 ranks" {
	SRC=$FLEXFS_SRC/tests/fixtures/paddle-formers-np2-p4/ckpt/checkpoint-5
	spread_files 3
	[[ ! -e $T/src0/model_state/0.metadata ||
		! -e $T/src0/optimizer_state/0.metadata ]]
	dm_equal 3 "tp=2"
	# a part held by one rank only
	rm -rf "$T"/src*
	spread_entries 2
	[[ -d $T/src0/model_state && ! -e $T/src0/optimizer_state ]]
	dm_equal 2 "tp=4,pp=2"
}

@test "MindSpore rank_N/ directories split file by file over 3 ranks" {
	SRC=$MS/ckpt
	spread_files 3
	dm_equal 3 "tp=2,$MS_ST"
}

@test "a Megatron save directory (tracker file, iter_N/) split file by file over 2 and 3 ranks equals one mount of it" {
	SRC=$FLEXFS_SRC/tests/fixtures/megatron-tied/ckpt
	spread_files 2
	# the tracker on one rank only, the iteration's files on both
	[[ $(ls "$T"/src*/latest_checkpointed_iteration.txt | wc -l) -eq 1 ]]
	[[ -d $T/src0/iter_0000100 && -d $T/src1/iter_0000100 ]]
	dm_equal 2 "tp=2"
	# 3 ranks: the tracker on every rank, the iteration on ranks 0 and 1
	# only (rank 2 holds none of its files), and megatron_iter= as well
	rm -rf "$T"/src* "$T"/mnt*
	spread_files 2
	dm_dirs 3
	cp -p "$SRC/latest_checkpointed_iteration.txt" "$T/src0/"
	cp -p "$SRC/latest_checkpointed_iteration.txt" "$T/src1/"
	cp -p "$SRC/latest_checkpointed_iteration.txt" "$T/src2/"
	dm_start 3 "tp=4"
	same_as_ref 3 "tp=4"
	# rank 2 (no iteration directory of its own) serves the modes the
	# others do: its stand-in directory has its save directory's
	[[ $(cd "$T/mnt2" && find . -printf '%m %p\n' | sort) == \
		$(cd "$T/mnt0" && find . -printf '%m %p\n' | sort) ]]
	dm_stop
	dm_equal 3 "tp=2,megatron_iter=100"
	# rank 2's empty stand-in directory is gone with the mount
	[[ -z $(find /tmp -maxdepth 1 -name 'flexfs-mpi-*' -newer "$T/src2" 2>/dev/null) ]]
}

@test "a DeepSpeed save directory (latest, global_stepN/) split file by file over 2 ranks equals one mount of it" {
	SRC=$FLEXFS_SRC/tests/fixtures/deepspeed/zero2-fp16-dp2/ckpt
	spread_files 2
	# latest on one rank only, the tag directory's files on both
	[[ $(ls "$T"/src*/latest | wc -l) -eq 1 ]]
	[[ -d $T/src0/global_step5 && -d $T/src1/global_step5 ]]
	dm_equal 2 "tp=2"
	# latest naming a tag no rank holds: one line on every rank
	rm -rf "$T"/src* "$T"/mnt*
	spread_files 2
	printf 'global_step6' >"$(ls "$T"/src*/latest)"
	dm_fails 2 "tp=2" "latest: names global_step6, which is not a directory on any rank"
}

@test "a Megatron legacy save directory (mp_rank_TT_PPP/ split between ranks) over 2 ranks equals one mount of it" {
	SRC=$FLEXFS_SRC/tests/fixtures/megatron-legacy-tp2pp2/ckpt
	spread_files 2
	# each rank holds some rank directories, none holds all
	[[ -n $(ls -d "$T"/src0/iter_0000100/mp_rank_* 2>/dev/null) ]]
	[[ -n $(ls -d "$T"/src1/iter_0000100/mp_rank_* 2>/dev/null) ]]
	dm_equal 2 "tp=2"
}

@test "a Megatron save directory whose tracker names release is entered and served as release/ over 2 ranks" {
	mkdir -p "$T/rel"
	cp -rp "$FLEXFS_SRC/tests/fixtures/megatron-tied/ckpt/iter_0000100" "$T/rel/release"
	printf 'release\n' >"$T/rel/latest_checkpointed_iteration.txt"
	SRC=$T/rel
	spread_files 2
	dm_start 2 "tp=2"
	same_as_ref 2 "tp=2"
	# the legacy tree names the release again, not an iteration
	[[ -n $(find "$T/mnt1" -maxdepth 2 -type d -name release) ]]
	[[ -z $(find "$T/mnt1" -maxdepth 2 -type d -name 'iter_*') ]]
	dm_stop
}

@test "a Megatron save directory whose tracker differs between ranks fails every rank with one line" {
	SRC=$FLEXFS_SRC/tests/fixtures/megatron-tied/ckpt
	spread_files 2
	printf '100' >"$T/src0/latest_checkpointed_iteration.txt"
	printf '200' >"$T/src1/latest_checkpointed_iteration.txt"
	dm_fails 2 "tp=2" \
		"latest_checkpointed_iteration.txt: rank 0 and rank 1 hold different files of this name (contents differ)"
	# the same tracker naming an iteration no rank holds
	printf '200' >"$T/src0/latest_checkpointed_iteration.txt"
	dm_fails 2 "tp=2" \
		"latest_checkpointed_iteration.txt: names iter_0000200, which is not a directory on any rank"
}

@test "a file held differently by two ranks fails every rank with one line" {
	split 3 twice
	local f
	f=$(cd "$T/src0" && ls __*.distcp | head -n 1)
	# the same size, one byte flipped in one copy only
	printf '\x01' | dd of="$T/src0/$f" bs=1 seek=200 conv=notrunc status=none
	dm_fails 3 "tp=2,rules=$RULES" "hold different files of this name"
}

@test "copies held twice are compared whole: one byte changed in the middle of 3 MiB fails every rank" {
	split 3 twice
	# an extra file of 3 MiB on ranks 1 and 2: their first and last
	# 64 KiB agree, the byte at 1.5 MiB does not
	head -c $((3 << 20)) /dev/urandom >"$T/src1/notes.bin"
	cp "$T/src1/notes.bin" "$T/src2/notes.bin"
	printf '\x5a' | dd of="$T/src2/notes.bin" bs=1 seek=$((3 << 19)) \
		conv=notrunc status=none
	cmp -s "$T/src1/notes.bin" "$T/src2/notes.bin" && return 1
	dm_fails 3 "tp=2,rules=$RULES" \
		"notes.bin: rank 1 and rank 2 hold different files of this name (contents differ)"
	# the same copies, identical: every rank mounts and serves them
	cp "$T/src1/notes.bin" "$T/src2/notes.bin"
	dm_start 3 "tp=2,rules=$RULES"
	local f
	f=$(cd "$T/mnt0" && find . -name notes.bin | head -n 1)
	[[ -n $f ]]
	cmp "$T/src1/notes.bin" "$T/mnt0/$f"
	dm_stop
}

@test "a file missing everywhere fails every rank with one line" {
	split 2 spread
	rm "$T/src1/__1_0.distcp"
	dm_fails 2 "tp=2,rules=$RULES" "__1_0.distcp.*held by no node"
}

# rank_pid RANK: the process id of rank RANK's daemon.
rank_pid() {
	local p

	for p in $(pgrep -P "$DM_PID") $(pgrep -x exe) $(pgrep -x flexfs); do
		if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null |
			grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

@test "a rank killed during reads: the others get EIO after the timeout, never hang or serve wrong bytes" {
	split 2 spread
	dm_start 2 "tp=2,rules=$RULES"
	ref_mount "tp=2,rules=$RULES"
	local victim start
	victim=$(rank_pid 1)
	# reads in flight when it dies
	(cat "$T"/mnt0/ranks/*/model.safetensors >/dev/null 2>&1 || true) 3>&- &
	kill -KILL "$victim"
	start=$SECONDS
	equal_or_eio
	# one timeout, then the dead rank fails at once
	((SECONDS - start < 4 * TIMEOUT + 10))
	# the EIO log line names the rank and why, not a changed file
	grep -E "failed: Input/output error \(rank 1: [^:]+: (timed out|rank ended)" "$DM_LOG"
	! grep -q "backing file changed" "$DM_LOG"
	unmount_ff "$T/ref"
	fusermount3 -u -z "$T/mnt1"
	start=$SECONDS
	fusermount3 -u "$T/mnt0"
	# rank 0 waits mpi_timeout for a proof of life from rank 1, then
	# exits without MPI_Finalize (which would wait for rank 1 forever);
	# under --enable-recovery OpenMPI 4.1 counts neither that nor the
	# killed rank against the job: status 0
	local rc=0
	wait_gone "$DM_PID" 150
	wait "$DM_PID" || rc=$?
	DM_PID=
	((SECONDS - start <= TIMEOUT + 10))
	[[ $rc -eq 0 ]]
	not_mounted "$T/mnt0"
}

@test "a rank stopped past mpi_timeout during reads, then resumed: unmounting ends every rank, mpirun exits 0" {
	split 2 spread
	ref_mount "tp=2,rules=$RULES"
	local victim
	# plain mpirun (as documented: a rank that exits without
	# MPI_Finalize fails the job) and with --enable-recovery (a rank
	# not told the end stays mounted)
	for DM_RECOVERY in "" --enable-recovery; do
		dm_start 2 "tp=2,rules=$RULES"
		victim=$(rank_pid 1)
		DM_STOPPED=$victim
		kill -STOP "$victim"
		# its bytes time out on rank 0 (requests left in its
		# queue, seen once it runs again)
		equal_or_eio
		grep -E "failed: Input/output error \(rank 1: [^:]+: timed out" "$DM_LOG"
		kill -CONT "$victim"
		DM_STOPPED=
		dm_stop
	done
	unmount_ff "$T/ref"
}

@test "a rank still stopped at the unmount: rank 0 ends within mpi_timeout, the stopped rank when resumed" {
	split 2 spread
	local victim r0 start rc
	# plain mpirun last: it kills the stopped rank, whose mount point
	# stays dead until the teardown.  Under --enable-recovery the end
	# message rank 0 sends while rank 1 is stopped is sometimes lost
	# (rank 0 exits before it is delivered) and the resumed rank keeps
	# serving until unmounted (docs/reliability.md, "What is left"):
	# that half runs with FLEXFS_MPI_RECOVERY_STOPPED=1 until it is fixed.
	local modes=("")
	[[ ${FLEXFS_MPI_RECOVERY_STOPPED:-} != 1 ]] ||
		modes=(--enable-recovery "")
	for DM_RECOVERY in "${modes[@]}"; do
		dm_start 2 "tp=2,rules=$RULES"
		victim=$(rank_pid 1)
		r0=$(rank_pid 0)
		DM_STOPPED=$victim
		kill -STOP "$victim"
		run -1 timeout $((TIMEOUT + 20)) cat "$T"/mnt0/ranks/tp00_pp00/model.safetensors
		start=$SECONDS
		fusermount3 -u "$T/mnt0"
		# no proof of life from rank 1 within mpi_timeout: rank 0
		# exits without MPI_Finalize
		wait_gone "$r0" $(((TIMEOUT + 10) * 10))
		((SECONDS - start <= TIMEOUT + 10))
		not_mounted "$T/mnt0"
		if [[ -z $DM_RECOVERY ]]; then
			# plain mpirun ends the job then, the stopped rank too
			# (killed, its mount point may stay dead until the
			# teardown): status 1
			rc=0
			wait_gone "$DM_PID" 100
			wait "$DM_PID" || rc=$?
			[[ $rc -eq 1 ]]
			wait_gone "$victim" 50
		else
			# mpirun waits for the stopped rank; resumed, it takes
			# the end, waits mpi_timeout for rank 0 in vain and exits
			# without MPI_Finalize too: status 0 under recovery
			kill -0 "$DM_PID"
			kill -CONT "$victim"
			start=$SECONDS
			rc=0
			# bounded, with room for a loaded machine's mpirun teardown;
			# past it, what every process of the job is doing
			wait_gone "$DM_PID" $(((2 * TIMEOUT + 40) * 10)) || {
				uptime >&2
				ps -eo pid,ppid,stat,wchan:24,etime,args |
					grep -E 'mpirun|prte|orted|flexfs' >&2
				for p in $(pgrep -f "mpi_timeout=$TIMEOUT"); do
					echo "== $p" >&2
					cat "/proc/$p/task/"*/wchan >&2 2>/dev/null
					echo >&2
				done
				cat "$DM_LOG" >&2
				false
			}
			wait "$DM_PID" || rc=$?
			((SECONDS - start <= 2 * TIMEOUT + 40))
			[[ $rc -eq 0 ]]
			not_mounted "$T/mnt1"
		fi
		DM_STOPPED=
		DM_PID=
	done
}

@test "a file changed on its holder after the start: EIO on the others, never its new bytes" {
	split 2 spread
	dm_start 2 "tp=2,rules=$RULES"
	ref_mount "tp=2,rules=$RULES"
	printf '\x01' | dd of="$T/src1/__1_0.distcp" bs=1 seek=300 conv=notrunc status=none
	equal_or_eio
	grep -E "failed: Input/output error \(rank 1: __1_0.distcp: could not read its copy" "$DM_LOG"
	! grep -q "backing file changed" "$DM_LOG"
	unmount_ff "$T/ref"
	dm_stop
}

# equal_or_eio: every file of the reference's ranks/ and hf/, read from
# rank 0 within TIMEOUT + 20 s, equals the reference's or fails with EIO;
# at least one fails.
equal_or_eio() {
	local f eio=0

	for f in $(cd "$T/ref" && find ranks hf -type f | sort); do
		if timeout $((TIMEOUT + 20)) cat "$T/mnt0/$f" >"$T/got" 2>"$T/err"; then
			cmp "$T/got" "$T/ref/$f"
		else
			grep -q "Input/output error" "$T/err"
			eio=$((eio + 1))
		fi
	done
	((eio > 0))
}

# stat NAME: rank 0's counter NAME from its FLEXFS_MPI_STATS line in DM_LOG.
stat() {
	grep -o "mpi stats: rank 0 .*" "$DM_LOG" | tr ' ' '\n' |
		grep -A1 -x "$1" | tail -n 1
}

# passes N: read every file of rank 0's ranks/ N times (no page cache:
# direct_io), each equal to the single mount's; then stop.
passes() {
	local k f
	for ((k = 0; k < $1; k++)); do
		for f in $(cd "$T/ref" && find ranks -type f | sort); do
			cmp "$T/mnt0/$f" "$T/ref/$f"
		done
	done
	dm_stop
}

@test "other ranks' bytes are kept in the block cache: re-reads fetch nothing more" {
	split 2 spread
	ref_mount "tp=2,rules=$RULES"
	export FLEXFS_MPI_STATS=1
	dm_start 2 "tp=2,rules=$RULES,direct_io=1"
	passes 1
	local once cached1
	once=$(stat bytes)
	cached1=$(stat cached)
	dm_start 2 "tp=2,rules=$RULES,direct_io=1"
	passes 3
	# the same bytes fetched from rank 1 for one pass and for three: the
	# second and third come from the cache
	[[ $(stat bytes) -eq $once ]]
	(($(stat cached) > cached1))
	# without room in the cache every pass fetches again
	dm_start 2 "tp=2,rules=$RULES,direct_io=1,cache_size=0"
	passes 3
	(($(stat bytes) > once))
	[[ $(stat cached) -eq 0 ]]
	unmount_ff "$T/ref"
}

@test "unmounting one rank ends every rank" {
	split 3 spread
	dm_start 3 "tp=2,rules=$RULES"
	dm_stop 1
}

@test "a Megatron-Core zarr save directory (key directories split file by file) over 2 and 3 ranks equals one mount of it" {
	SRC=$FLEXFS_SRC/tests/fixtures/megatron-zarr/ckpt
	spread_files 2
	# every key directory is split between the ranks
	[[ -f $T/src0/iter_0000100/output_layer.weight/.zarray ||
		-f $T/src1/iter_0000100/output_layer.weight/.zarray ]]
	[[ -d $T/src0/iter_0000100/output_layer.weight &&
		-d $T/src1/iter_0000100/output_layer.weight ]]
	dm_equal 2 "tp=2"
	rm -rf "$T"/src* "$T"/mnt*
	spread_files 3
	dm_equal 3 "tp=4,pp=2"
}
