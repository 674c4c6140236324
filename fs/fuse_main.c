/* SPDX-License-Identifier: MIT */
/*
 * flexfs: mount a checkpoint read-only as resharded views.
 *
 *   flexfs [options] CHECKPOINT MOUNTPOINT
 *   mount -t flexfs CHECKPOINT MOUNTPOINT -o tp=4   (via /sbin/mount.flexfs)
 *
 * Startup order matters: mount(8), mount.fuse3 and fstab only see the
 * exit status of the process they ran, so everything that can fail (the
 * options, the checkpoint, the plan, the tree, the mount itself) fails
 * before fuse_daemonize(), with one line on stderr and exit status 1.
 * The sequence follows libfuse 3.14's example/hello_ll.c.
 */
#include "fuse_ll.h"
#include "mountopts.h"
#include "optdoc.h"

#include "ckpt.h"
#include "error.h"
#include "plan.h"
#include "stack.h"
#include "transform.h"
#include "tree.h"
#include "within.h"
#include "zcache.h"

#ifdef FLEXFS_WITH_MPI
#include "mpi_mount.h"
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FLEXFS_VERSION
#define FLEXFS_VERSION "unknown"
#endif

/* Idle worker threads kept by the multithreaded loop unless -o
 * max_idle_threads= says otherwise (libfuse's default is unbounded). */
#define FLX_IDLE_THREADS 10

enum { KEY_HELP, KEY_VERSION };

static const struct fuse_opt flx_opt_table[] = {
    FUSE_OPT_KEY("-h", KEY_HELP),
    FUSE_OPT_KEY("--help", KEY_HELP),
    FUSE_OPT_KEY("-V", KEY_VERSION),
    FUSE_OPT_KEY("--version", KEY_VERSION),
    FUSE_OPT_END,
};

struct cmdline {
	flx_mountopts mo;
	flx_error err;
	int nonopts; /* non-option arguments seen */
	bool help;
	bool version;
};

static void report(const flx_error *e)
{
	char line[4 * FLX_ERR_FIELD];

	fprintf(stderr, "flexfs: %s\n", flx_error_line(e, line, sizeof(line)));
}

/* -o log=FILE: opened (created 0640 when missing, appended to) before
 * mounting, so that a path that cannot be written fails the mount.
 * @return 0 and *fd (owned), or -errno after saying why. */
static int open_log(const char *path, int *fd)
{
	flx_error e;

	*fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY,
		   0640);
	if (*fd >= 0)
		return 0;
	flx_error_init(&e);
	flx_error_set(&e, -errno, path, "log", "cannot open: %s",
		      strerror(errno));
	report(&e);
	return e.code;
}

/*
 * The distributed mount (-o mpi, resolver/remote/mpi_mount.h): MPI starts
 * before the paths are looked at ({rank} in them is this rank), every rank
 * agrees on each step that can fail (one rank's failure fails all, with its
 * line), and the mount of any rank ending ends all of them.  Without MPI in the
 * build, -o mpi is an error.
 */
#ifdef FLEXFS_WITH_MPI
static flx_dm *dmount;

/* Another rank ended the mount: end this one as a signal would. */
static void dmount_told(void *arg)
{
	(void)arg;
	kill(getpid(), SIGTERM);
}

/* MPI, and {rank} replaced in the source and in libfuse's arguments (the
 * mount point, which libfuse resolves as it parses). */
static int dmount_start(flx_mountopts *mo, struct fuse_args *args,
			flx_error *err)
{
	char *src = NULL;
	int rc = flx_dm_init(NULL, NULL, mo->mpi_timeout, &dmount, err);

	if (!rc)
		rc = flx_dm_subst(mo->source, flx_dm_rank(dmount), &src);
	if (!rc)
		rc = flx_mo_set_source(mo, src);
	free(src);
	for (int i = 0; !rc && i < args->argc; i++) {
		if (!strstr(args->argv[i], "{rank}"))
			continue;
		rc = flx_dm_subst(args->argv[i], flx_dm_rank(dmount), &src);
		if (rc)
			break;
		if (args->allocated)
			free(args->argv[i]);
		args->argv[i] = src;
	}
	return rc && !err->code
		   ? flx_error_set(err, rc, NULL, NULL, "out of memory")
		   : rc;
}

static int dmount_agree(int rc, flx_error *err)
{
	return dmount ? flx_dm_agree(dmount, rc, err) : rc;
}

static int dmount_exchange(const char *dir, flx_ckpt_opts *o,
			   const char **open_dir, flx_error *err)
{
	int rc = flx_dm_exchange(dmount, dir, o, err);

	if (rc)
		return rc;
	o->backend = flx_dm_backend(dmount);
	o->format = flx_dm_format(dmount);
	*open_dir = flx_dm_dir(dmount);
	return 0;
}

/* Other ranks' bytes kept in the mount's block cache (one budget). */
static void dmount_cache(flx_bcache *cache)
{
	if (dmount)
		flx_dm_set_cache(dmount, cache);
}

/* Whether the loop may start: not when another rank already ended. */
static bool dmount_serving(void)
{
	if (!dmount)
		return true;
	flx_dm_on_end(dmount, dmount_told, NULL);
	return !flx_dm_told(dmount);
}

/* A failed read's cause, for the EIO log line (flx_ll.why). */
static void dmount_why(void *arg, char *buf, size_t len)
{
	(void)arg;
	if (dmount)
		flx_dm_why(dmount, buf, len);
}

/* FLEXFS_MPI_STATS=1 (benchmarks): the counters on stderr, one line. */
static void dmount_end(void)
{
	const char *on = getenv("FLEXFS_MPI_STATS");
	flx_dm_stats s;

	if (dmount && on && !strcmp(on, "1")) {
		flx_dm_stats_get(dmount, &s);
		fprintf(
		    stderr,
		    "flexfs: mpi stats: rank %d exchange %llu bcast %llu "
		    "batches %llu requests %llu spans %llu bytes %llu "
		    "served %llu served_bytes %llu digested %llu "
		    "digest_ns %llu cached %llu\n",
		    flx_dm_rank(dmount), (unsigned long long)s.exchange_bytes,
		    (unsigned long long)s.bcast_bytes,
		    (unsigned long long)s.batches,
		    (unsigned long long)s.requests, (unsigned long long)s.spans,
		    (unsigned long long)s.bytes, (unsigned long long)s.served,
		    (unsigned long long)s.served_bytes,
		    (unsigned long long)s.digested,
		    (unsigned long long)s.digest_ns,
		    (unsigned long long)s.cached);
	}
	flx_dm_end(dmount);
	dmount = NULL;
}
#else
static int dmount_start(flx_mountopts *mo, struct fuse_args *args,
			flx_error *err)
{
	(void)mo;
	(void)args;
	return flx_error_set(err, -ENOTSUP, NULL, "mpi",
			     "this flexfs was built without MPI "
			     "(FLEXFS_WITH_MPI)");
}

static int dmount_agree(int rc, flx_error *err)
{
	(void)err;
	return rc;
}

static int dmount_exchange(const char *dir, flx_ckpt_opts *o,
			   const char **open_dir, flx_error *err)
{
	(void)dir;
	(void)o;
	(void)open_dir;
	(void)err;
	return -ENOTSUP;
}

static void dmount_cache(flx_bcache *cache)
{
	(void)cache;
}

static bool dmount_serving(void)
{
	return true;
}

static void dmount_why(void *arg, char *buf, size_t len)
{
	(void)arg;
	if (len)
		buf[0] = '\0';
}

static void dmount_end(void)
{
}
#endif

/* fuse_opt callback: -1 error, 0 consumed, 1 keep for libfuse. */
static int opt_proc(void *data, const char *arg, int key,
		    struct fuse_args *outargs)
{
	struct cmdline *cl = data;

	(void)outargs;
	switch (key) {
	case KEY_HELP:
		cl->help = true;
		return 0;
	case KEY_VERSION:
		cl->version = true;
		return 0;
	case FUSE_OPT_KEY_NONOPT:
		/* The first is ours; the mountpoint (and any surplus, which
		 * fuse_parse_cmdline() rejects) stays for libfuse. */
		if (cl->nonopts++)
			return 1;
		if (flx_mo_set_source(&cl->mo, arg) == 0)
			return 0;
		flx_error_set(&cl->err, -ENOMEM, NULL, NULL, "out of memory");
		return -1;
	case FUSE_OPT_KEY_OPT:
		if (arg[0] == '-') /* -f, -d, -s...: libfuse's own flags */
			return 1;
		return flx_mo_option(&cl->mo, arg, &cl->err) ? -1 : 0;
	}
	return 1;
}

static void usage(const char *prog)
{
	flx_doc_usage(stdout, &flx_doc_flexfs, prog);
	printf("\nlibfuse options:\n");
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

/* Canonical source path, so fsname= and later opens do not depend on
 * the cwd that fuse_daemonize() leaves. */
static int canonical_source(struct cmdline *cl)
{
	char *real = realpath(cl->mo.source, NULL);
	int rc;

	if (!real)
		return flx_error_set(&cl->err, -errno, cl->mo.source, NULL,
				     "%s", strerror(errno));
	rc = flx_mo_set_source(&cl->mo, real);
	free(real);
	return rc ? flx_error_set(&cl->err, rc, NULL, NULL, "out of memory")
		  : 0;
}

/* Whether mnt is the checkpoint directory source (canonical) or lies inside
 * it: the mount would hide the files it serves, and their path checks
 * would go through the mount itself.  A mount point that cannot be
 * resolved is left to fuse_session_mount(), which says why. */
static bool inside_source(const char *source, const char *mnt)
{
	char *real = realpath(mnt, NULL);
	size_t n = strlen(source);
	bool in;

	if (!real)
		return false;
	in = strncmp(real, source, n) == 0 &&
	     (real[n] == '\0' || real[n] == '/' || source[n - 1] == '/');
	/* another name for the same directory (a bind mount) */
	in = in || flx_path_within_dir(source, real);
	free(real);
	return in;
}

/* The text of /proc/self/mountinfo (bounded: a pathological mount table is
 * not worth more than 64 MiB).  @return 0 and *out (owned: free()), or
 * -errno. */
static int read_mountinfo(char **out)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	char *text = NULL;
	size_t len = 0, cap = 0, n;
	int rc = -ENOMEM;

	if (!f)
		return -errno;
	while (cap < (64u << 20)) {
		char *nt = realloc(text, cap = cap ? 2 * cap : 65536);

		if (!nt)
			break;
		text = nt;
		n = fread(text + len, 1, cap - 1 - len, f);
		len += n;
		if (len < cap - 1) {
			text[len] = '\0';
			rc = ferror(f) ? -EIO : 0;
			break;
		}
	}
	fclose(f);
	if (rc)
		free(text);
	else
		*out = text;
	return rc;
}

/* A mount point that already is a flexfs mount (mounting again would stack
 * a second one over it), or that has entries the mount would hide unless
 * -o nonempty: the reason, or NULL when mnt is fine (or cannot be looked
 * at: fuse_session_mount() then says why). */
static const char *mountpoint_refused(const flx_mountopts *mo, const char *mnt)
{
	char *real = realpath(mnt, NULL), *info = NULL, type[64];
	const char *why = NULL;
	struct dirent *e;
	DIR *d;

	if (!real)
		return NULL;
	type[0] = '\0';
	if (read_mountinfo(&info) == 0 &&
	    flx_mo_mountinfo_type(info, real, type, sizeof(type)) == 0 &&
	    strcmp(type, "fuse." FLX_MO_SUBTYPE) == 0)
		why = "is already a flexfs mount (unmount it first: "
		      "fusermount3 -u)";
	free(info);
	free(real);
	/* an automount point (fstab x-systemd.automount) is an autofs mount
	 * whose listing would wait for this very mount */
	if (why || mo->nonempty || !strcmp(type, "autofs") ||
	    !(d = opendir(mnt)))
		return why;
	while ((e = readdir(d)) && !why)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			why = "is not empty: the mount would hide its files "
			      "(mount with -o nonempty to mount over them)";
	closedir(d);
	return why;
}

/* Options, source and libfuse's command line; prints what went wrong.
 * @return 0 to mount, 1 to exit with failure, 2 to exit with success. */
static int parse(const char *prog, struct cmdline *cl, struct fuse_args *args,
		 struct fuse_cmdline_opts *fo)
{
	char *optstr = NULL;
	const char *why;
	int rc;

	if (fuse_opt_parse(args, cl, flx_opt_table, opt_proc) == -1) {
		if (cl->err.code)
			report(&cl->err);
		return 1;
	}
	if (cl->help) {
		usage(prog);
		return 2;
	}
	if (cl->version) {
		printf("flexfs version %s\nFUSE library version %s\n",
		       FLEXFS_VERSION, fuse_pkgversion());
		fflush(stdout); /* before fusermount3 --version writes */
		fuse_lowlevel_version();
		return 2;
	}
	if (!cl->mo.source) {
		fprintf(stderr,
			"flexfs: missing CHECKPOINT and MOUNTPOINT "
			"(see %s --help)\n",
			prog);
		return 1;
	}
	if (cl->mo.mpi && dmount_start(&cl->mo, args, &cl->err)) {
		report(&cl->err);
		return 1;
	}
	if (canonical_source(cl)) {
		report(&cl->err);
		return 1;
	}
	rc = flx_mo_fuse_optstring(&cl->mo, &optstr);
	if (rc || fuse_opt_add_arg(args, "-o") ||
	    fuse_opt_add_arg(args, optstr)) {
		free(optstr);
		fprintf(stderr, "flexfs: out of memory\n");
		return 1;
	}
	free(optstr);
	if (fuse_parse_cmdline(args, fo) != 0) /* libfuse printed why */
		return 1;
	if (!fo->mountpoint) {
		fprintf(stderr, "flexfs: missing MOUNTPOINT (see %s --help)\n",
			prog);
		return 1;
	}
	if (cl->mo.mpi) /* under mpirun: never fork away from it */
		fo->foreground = 1;
	if (inside_source(cl->mo.source, fo->mountpoint)) {
		flx_error_set(&cl->err, -EINVAL, fo->mountpoint, NULL,
			      "the mount point is inside the checkpoint "
			      "directory %s (the mount would hide it)",
			      cl->mo.source);
		report(&cl->err);
		return 1;
	}
	why = mountpoint_refused(&cl->mo, fo->mountpoint);
	if (why) {
		flx_error_set(&cl->err, -EINVAL, fo->mountpoint, NULL, "%s",
			      why);
		report(&cl->err);
		return 1;
	}
	return 0;
}

/* Checkpoint -> plan -> tree, every check that needs the real metadata,
 * by the path flexfs-inspect takes too (stack.h).
 * @return 0, or -errno after printing the one error line. */
static int build(const struct cmdline *cl, flx_stack *st)
{
	flx_ckpt_opts o = flx_mo_ckpt_opts(&cl->mo);
	const char *dir = cl->mo.source;
	char note[2 * FLX_ERR_FIELD];
	flx_error err;
	int rc;

	flx_error_init(&err);
	/* the distributed mount opens the iteration directory it entered */
	rc = cl->mo.mpi ? dmount_exchange(cl->mo.source, &o, &dir, &err) : 0;
	if (rc) {
		report(&err);
		return rc;
	}
	rc = flx_stack_build(dir, &o, &cl->mo.spec, false, st, &err);
	if (cl->mo.mpi)
		rc = dmount_agree(rc, &err);
	for (size_t i = 0; !rc && !flx_stack_note(st, i, note, sizeof(note));
	     i++)
		fprintf(stderr, "flexfs: %s: %s\n", cl->mo.source, note);
	if (rc)
		report(&err);
	return rc;
}

/* The mount's bdi, for raise_read_ahead() in fuse_ll.c.  Read from
 * /proc/self/mountinfo: a stat() of the mount point would wait for the
 * INIT that only the loop, not yet running, can answer. */
static void find_bdi(const flx_mountopts *mo, const char *mnt, flx_ll *ll)
{
	char *text = NULL;
	int rc;

	/* Same "auto" sentinel on both sides of the option layer. */
	ll->read_ahead_kb = mo->read_ahead_kb == FLX_MO_READ_AHEAD_AUTO
				? FLX_LL_RA_AUTO
				: mo->read_ahead_kb;
	ll->ra_verbose = mo->ra_given;
	if (!mo->read_ahead_kb)
		return;
	rc = read_mountinfo(&text);
	if (!rc)
		rc = flx_mo_mountinfo_dev(text, mnt, ll->bdi, sizeof(ll->bdi));
	free(text);
	if (rc && ll->ra_verbose)
		fprintf(stderr,
			"flexfs: read_ahead_kb=%u not applied: no bdi for %s "
			"in /proc/self/mountinfo: %s\n",
			ll->read_ahead_kb, mnt, strerror(-rc));
	if (rc)
		ll->bdi[0] = '\0';
}

static int loop(struct fuse_session *se, const struct fuse_cmdline_opts *fo)
{
	struct fuse_loop_config *cfg;
	int rc;

	if (fo->singlethread)
		return fuse_session_loop(se);
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		return -ENOMEM;
	fuse_loop_cfg_set_clone_fd(cfg, fo->clone_fd);
	fuse_loop_cfg_set_idle_threads(cfg, fo->max_idle_threads == UINT_MAX
						? FLX_IDLE_THREADS
						: fo->max_idle_threads);
	fuse_loop_cfg_set_max_threads(cfg, fo->max_threads);
	rc = fuse_session_loop_mt(se, cfg);
	fuse_loop_cfg_destroy(cfg);
	return rc;
}

/*
 * The end of the session: 0 or the signal that ended it (a requested
 * shutdown), else the loop's -errno.  -ECONNABORTED is an unmount too:
 * when the connection is torn down (the last user of a lazily unmounted
 * tree went away) while a worker is dequeuing a request, the kernel's
 * fuse_dev_do_read() fails that read with ECONNABORTED instead of ENODEV,
 * and libfuse 3.14 only takes ENODEV for the end of the session.
 */
static bool loop_failed(int rc)
{
	return rc < 0 && rc != -ECONNABORTED;
}

/*
 * Huge pages for the heap.  Building a large namespace touches hundreds
 * of MiB of fresh heap, and where each 4 KiB page fault is expensive (a
 * VM that returns freed memory to its host; docs/performance.md) faulting
 * is most of the mount time.  glibc's malloc asks for transparent huge pages
 * when the tunable glibc.malloc.hugetlb=1 is set, and tunables are read only at
 * startup, so when THP is in "madvise" mode and the tunable is not set,
 * the process re-executes itself once with it added.  FLX_THP_ENV marks
 * the second start and carries what to restore, so nothing leaks to
 * children (fusermount3).  FLEXFS_MALLOC_THP=0 turns this off.
 */
#define FLX_THP_ENV	"FLEXFS_THP_REEXEC"
#define FLX_THP_TUNABLE "glibc.malloc.hugetlb=1"

static bool thp_madvise_mode(void)
{
	char buf[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	bool yes;

	if (!f)
		return false;
	yes = fgets(buf, sizeof(buf), f) && strstr(buf, "[madvise]");
	fclose(f);
	return yes;
}

/* Put GLIBC_TUNABLES back as FLX_THP_ENV recorded it, and drop the mark:
 * on the second start, or when the re-exec failed. */
static void thp_restore(void)
{
	const char *mark = getenv(FLX_THP_ENV);

	if (!mark)
		return;
	if (*mark == '-')
		unsetenv("GLIBC_TUNABLES");
	else
		setenv("GLIBC_TUNABLES", mark + 1, 1);
	unsetenv(FLX_THP_ENV);
}

static void malloc_thp(char **argv)
{
	const char *old, *off;
	char *tun;

	if (getenv(FLX_THP_ENV)) { /* second start */
		thp_restore();
		return;
	}
	old = getenv("GLIBC_TUNABLES");
	off = getenv("FLEXFS_MALLOC_THP");
	if ((off && !strcmp(off, "0")) ||
	    (old && strstr(old, "glibc.malloc.hugetlb")) || !thp_madvise_mode())
		return;
	/* "-": there was none; "=VALUE": there was VALUE. */
	if (asprintf(&tun, "%s%s", old ? "=" : "-", old ? old : "") < 0)
		return;
	if (setenv(FLX_THP_ENV, tun, 1) == 0) {
		free(tun);
		if (asprintf(&tun, "%s%s%s", old ? old : "", old ? ":" : "",
			     FLX_THP_TUNABLE) >= 0 &&
		    setenv("GLIBC_TUNABLES", tun, 1) == 0)
			execv("/proc/self/exe", argv);
		thp_restore(); /* exec failed: carry on without */
	}
	free(tun);
}

/* The block cache of strided gathers (cache_size=, or sized to the
 * largest chunk they read), and the slicer executing them, chosen here
 * once for the mount; the window cache of zstd items (zcache.h) when the
 * checkpoint has any, from the same budget.  A tensor saved transposed
 * whose chunk outgrows it is re-read for every request, so say so while
 * the user can still see stderr.  @return 0 or -ENOMEM. */
static int make_cache(const flx_mountopts *mo, const flx_ckpt *ckpt, flx_fs *fs,
		      const flx_slicer *slicer, flx_bcache **out,
		      flx_zcache **zout)
{
	const flx_tensor *t;
	uint64_t span = flx_ckpt_gather_span(ckpt, &t), bytes, zbytes = 0;
	bool zstd = flx_ckpt_has_zstd(ckpt);
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

	bytes = flx_mo_cache_bytes(
	    mo, span,
	    pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0);
	if (span > bytes)
		fprintf(stderr,
			"flexfs: %s: %s is saved with a strided innermost "
			"axis (a chunk spans %llu MiB, more than the block "
			"cache's %llu MiB): reads of it will re-read the "
			"chunk; mount with -o cache_size=%lluM\n",
			ckpt->dir, t->fqn,
			(unsigned long long)((span + (1u << 20) - 1) >> 20),
			(unsigned long long)(bytes >> 20),
			(unsigned long long)(flx_mo_cache_fit(span) >> 20));
	/* one budget: zstd items' decompressed windows take it all, or half
	 * when transposed chunks need blocks too */
	if (zstd) {
		zbytes = span ? bytes / 2 : bytes;
		bytes -= zbytes;
	}
	if (flx_bcache_new(bytes, FLX_BCACHE_BLOCK, out) ||
	    (zstd && flx_zcache_new(zbytes, zout))) {
		fprintf(stderr, "flexfs: out of memory\n");
		return -ENOMEM;
	}
	flx_fs_set_io(fs, &(flx_view_io){*out, slicer, *zout});
	return 0;
}

/* The slicer of -o gpu=, gpu_min=, gpu_device= (gpu/slice.h): with gpu=on
 * the mount log names the device, or the mount fails with the reason why
 * there is none; gpu=auto says nothing, as a mount that has nothing to
 * report (index.json and flexfs-inspect name the backend).
 * @return 0 or -errno. */
static int open_slicer(const flx_mountopts *mo, const flx_slicer **out)
{
	char line[1024];
	int rc = flx_slicer_open(&mo->gpu, out, line, sizeof(line));

	if (rc == -ENOMEM)
		fprintf(stderr, "flexfs: out of memory\n");
	else if (rc || mo->gpu.mode == FLX_GPU_ON)
		fprintf(stderr, "flexfs: %s\n", line);
	return rc;
}

/* FLEXFS_ZSTD_STATS=1 (benchmarks): the zstd window cache's counters on
 * stderr when the daemon exits, one line. */
static void zstd_stats(flx_zcache *z)
{
	flx_zcache_stats st;
	const char *on = getenv("FLEXFS_ZSTD_STATS");

	if (!z || !on || strcmp(on, "1") != 0)
		return;
	flx_zcache_stats_get(z, &st);
	fprintf(stderr,
		"flexfs: zstd stats: decoded %llu served %llu hits %llu "
		"misses %llu restarts %llu windows %llu ahead %llu "
		"workers %llu ahead_peak %llu\n",
		(unsigned long long)st.decoded, (unsigned long long)st.served,
		(unsigned long long)st.hits, (unsigned long long)st.misses,
		(unsigned long long)st.restarts, (unsigned long long)st.windows,
		(unsigned long long)st.ahead, (unsigned long long)st.workers,
		(unsigned long long)st.ahead_peak);
}

/* FLEXFS_FUSE_STATS=1 (tests, benchmarks): the requests served, one
 * line: READ requests, opens, opens answered passthrough, and READ
 * requests replied from mapped backing files. */
static void fuse_stats(const flx_ll *ll)
{
	const char *on = getenv("FLEXFS_FUSE_STATS");

	if (!on || strcmp(on, "1"))
		return;
	fprintf(stderr,
		"flexfs: fuse stats: reads %lu opens %lu passthrough %lu "
		"mapped %lu\n",
		__atomic_load_n(&ll->n_reads, __ATOMIC_RELAXED),
		__atomic_load_n(&ll->n_opens, __ATOMIC_RELAXED),
		__atomic_load_n(&ll->n_pass_opens, __ATOMIC_RELAXED),
		__atomic_load_n(&ll->n_mapped, __ATOMIC_RELAXED));
}

int main(int argc, char **argv)
{
	struct fuse_cmdline_opts fo;
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se;
	struct cmdline cl;
	flx_stack st = {0};
	flx_bcache *cache = NULL;
	flx_zcache *zcache = NULL;
	const flx_slicer *slicer = NULL;
	char **av = NULL;
	int ac, ret = 1, rc, log_fd = -1;
	flx_ll ll = {0};

	malloc_thp(argv);
	/* one descriptor per file of the checkpoint; failing to raise the
	 * limit is not an error until a file cannot be opened */
	(void)flx_nofile_raise();
	memset(&fo, 0, sizeof(fo));
	memset(&cl, 0, sizeof(cl));
	if (flx_mo_init(&cl.mo) || flx_mo_argv(argc, argv, &ac, &av)) {
		fprintf(stderr, "flexfs: out of memory\n");
		goto err_out1;
	}
	args = (struct fuse_args)FUSE_ARGS_INIT(ac, av);
	rc = parse(argv[0], &cl, &args, &fo);
	/* the ranks of a distributed mount fail together */
	if (cl.mo.mpi && rc != 2 && dmount_agree(rc ? -EINVAL : 0, &cl.err)) {
		if (!rc)
			report(&cl.err);
		rc = 1;
	}
	if (rc) {
		ret = rc == 2 ? 0 : 1;
		goto err_out1;
	}
	/* the slicer first: index.json records it */
	if (open_slicer(&cl.mo, &slicer))
		goto err_out1;
	cl.mo.spec.slicer = slicer->name;
	if (build(&cl, &st))
		goto err_out1;
	if (make_cache(&cl.mo, flx_stack_ckpt(&st), st.fs, slicer, &cache,
		       &zcache))
		goto err_out1;
	dmount_cache(cache);
	/* which files the kernel may read from their backing file */
	if (cl.mo.passthrough && flx_fs_mark_whole(st.fs)) {
		fprintf(stderr, "flexfs: out of memory\n");
		goto err_out1;
	}

	if (cl.mo.log_file && open_log(cl.mo.log_file, &log_fd))
		goto err_out1;
	ll = (flx_ll){.fs = st.fs,
		      .foreground = fo.foreground,
		      .log_fd = log_fd,
		      .direct_io = cl.mo.direct_io,
		      .passthrough = cl.mo.passthrough,
		      .push_kb = cl.mo.push_ahead_kb,
		      .nfiles = flx_stack_ckpt(&st)->nfiles,
		      .logged = calloc(flx_fs_inode_count(st.fs) + 1, 1),
		      .why = dmount_why};
	se = flx_ll_session_new(&args, &ll);
	if (se == NULL)
		goto err_out1;
	if (fuse_set_signal_handlers(se) != 0)
		goto err_out2;
	if (fuse_session_mount(se, fo.mountpoint) != 0)
		goto err_out3;
	if (flx_ll_session_mounted(se) != 0)
		goto err_out4;
	find_bdi(&cl.mo, fo.mountpoint, &ll);
	/* Past this point stderr is /dev/null unless -f: nothing may fail
	 * for a reason the user could have been told about. */
	if (dmount_serving() && fuse_daemonize(fo.foreground) == 0) {
		flx_slicer_start(slicer); /* forked for the last time */
		rc = loop(se, &fo);
		ret = loop_failed(rc) ? 1 : 0;
		zstd_stats(zcache);
		fuse_stats(&ll);
	}
err_out4:
	fuse_session_unmount(se);
err_out3:
	fuse_remove_signal_handlers(se);
err_out2:
	fuse_session_destroy(se);
err_out1:
	if (log_fd >= 0)
		close(log_fd);
	free(ll.logged);
	flx_bcache_free(cache);
	flx_zcache_free(zcache);
	flx_stack_free(&st);
	free(fo.mountpoint);
	fuse_opt_free_args(&args);
	free(av);
	flx_mo_release(&cl.mo);
	flx_slicer_close(slicer);
	dmount_end();
	return ret;
}
