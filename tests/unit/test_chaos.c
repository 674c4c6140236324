/* SPDX-License-Identifier: MIT */
/*
 * Allocation-failure ("chaos") test, in the style of jansson's memory
 * tests: the whole mount path -- flx_spec_init/set (tp=3, pp=2, the rules
 * file), flx_ckpt_open() of the torch 1.13 fixture (or the checkpoint and
 * rules named on the command line), flx_plan_build(),
 * flx_fs_build() -- is run again and again, and run N makes the N-th
 * allocation fail (only that one).  Every run must either succeed (and
 * then free everything) or return -ENOMEM with err.code set and a one-line
 * reason; it must not crash or hang; and every allocation it made must be
 * freed once the objects are released.
 *
 * malloc/calloc/realloc/free (and the memalign family) are interposed in
 * this executable and forward to glibc's __libc_* entry points.  glibc
 * routes its own internal allocations (strdup, strndup, asprintf, realpath,
 * fdopendir, regcomp, qsort's buffer, ...) through the interposed malloc,
 * and so does jansson (through flexfs's json guard, which calls malloc).
 * Allocations made while a run is traced are kept in a pointer set (no
 * heap of its own), so a leak is an entry left over (except the blocks
 * glibc's regcomp() itself leaks when it runs out of memory: counted,
 * not failed).  One untraced run
 * first warms up libc's one-time caches.  Each run is made in a forked
 * child, so a crash or a hang is reported (with the backtrace of the
 * failed allocation) and the test goes on with the next run.
 *
 * The loop stops at the first run that completes without reaching its
 * failing allocation.  Every one of the first FULL_PREFIX allocations is
 * failed; after that only every k-th, k chosen from the measured speed to
 * keep the loop near TIME_BUDGET_S (the output says so).
 * FLX_CHAOS_STRIDE=k forces the stride (1: fail every allocation);
 * FLX_CHAOS_ONLY=n makes only the run that fails allocation n, in this
 * process (for a debugger).
 *
 * Skipped (77) under AddressSanitizer, which owns malloc.
 */
#include "check.h"
#include "ckpt.h"
#include "plan.h"
#include "spec.h"
#include "tree.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define CHAOS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHAOS_ASAN 1
#endif
#endif

#ifdef CHAOS_ASAN

int main(void)
{
	(void)check_failures;
	printf("SKIP: AddressSanitizer owns malloc; the allocation-failure "
	       "test cannot interpose it\n");
	return 77;
}

#else

#include <dlfcn.h>
#include <execinfo.h>
#include <jansson.h>
#include <malloc.h>
#include <regex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The checkpoint and rules file of the mount path (argv[1], argv[2]):
 * by default the torch 1.13 DCP fixture; ctest also runs the HF source. */
static const char *ckpt_dir = "fixtures/dcp-t113/ckpt";
static const char *rules_file = "fixtures/rules.json";

/* Fail every allocation up to here; beyond, every k-th (see above). */
#define FULL_PREFIX   1500ul
#define TIME_BUDGET_S 35.0
#define RUN_ALARM_S   20u
#define MAX_GROUPS    64
#define MAX_SITES     4096
#define BT_DEPTH      48

/* ---- glibc's allocator, under its exported internal names ---- */

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

/* ---- pointer set: open addressing, linear probing, backward-shift
 * deletion; static so it never allocates ---- */

#define SET_BITS 18
#define SET_SIZE ((size_t)1 << SET_BITS)

struct slot {
	void *p;
	unsigned long idx; /* which allocation of the run made it */
	bool rx;	   /* made inside regcomp() */
};

static struct slot set[SET_SIZE];
static size_t set_live;
static bool set_full; /* a run outgrew the set: the test is invalid */

static size_t slot_of(const void *p)
{
	return (size_t)(((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull >>
			(64 - SET_BITS));
}

static void set_add(void *p, unsigned long idx, bool rx)
{
	size_t i = slot_of(p);

	if (set_live >= SET_SIZE / 2) {
		set_full = true;
		return;
	}
	while (set[i].p)
		i = (i + 1) & (SET_SIZE - 1);
	set[i].p = p;
	set[i].idx = idx;
	set[i].rx = rx;
	set_live++;
}

/* Remove p; false when it was not there. */
static bool set_del(const void *p)
{
	size_t i = slot_of(p), j, k;

	while (set[i].p != p) {
		if (!set[i].p)
			return false;
		i = (i + 1) & (SET_SIZE - 1);
	}
	set[i].p = NULL;
	set_live--;
	/* move back the entries of the cluster that the hole would hide */
	for (j = (i + 1) & (SET_SIZE - 1); set[j].p;
	     j = (j + 1) & (SET_SIZE - 1)) {
		k = slot_of(set[j].p);
		if ((j > i && (k <= i || k > j)) ||
		    (j < i && k <= i && k > j)) {
			set[i] = set[j];
			set[j].p = NULL;
			i = j;
		}
	}
	return true;
}

/* ---- what a run leaves for the parent (shared with the child) ---- */

enum stage { ST_SPEC_INIT, ST_SPEC, ST_OPEN, ST_PLAN, ST_FS, ST_DONE };

static const char *const stage_names[] = {
    "flx_spec_init",  "flx_spec_set", "flx_ckpt_open",
    "flx_plan_build", "flx_fs_build", "done",
};

struct outcome {
	int rc;
	enum stage stage; /* where it stopped */
	flx_error err;
	unsigned long allocs;
	size_t leaked;		  /* by flexfs */
	unsigned long first_leak; /* the oldest of those */
	size_t glibc_leaked;	  /* by regcomp() as it failed */
	uint64_t tree;		  /* fingerprint of the built tree */
	int signal;		  /* the child died of it (SIGALRM: a hang) */
};

struct shared {
	unsigned long n_allocs; /* allocations of the current run */
	unsigned long fail_at;	/* the one to fail (0: none) */
	unsigned long trace_at; /* the one whose backtrace to keep */
	bool hit;		/* fail_at was reached */
	bool fail_in_rx;	/* ... inside regcomp() */
	void *fail_site;	/* caller of the failed allocation */
	void *rx_caller;	/* the call of that regcomp() */
	void *bt[BT_DEPTH];	/* backtrace of fail_at or trace_at */
	int bt_n;
	bool set_full;
	struct outcome o;
};

static struct shared *sh; /* MAP_SHARED: survives the child's death */

/* ---- the hooks ---- */

static bool tracing; /* count and record allocations (in the child) */
static __thread int in_hook;
static __thread int in_regcomp;
static __thread void *regcomp_caller; /* flexfs's call of regcomp() */

/* Count one allocation; true if it is the one to fail. */
static bool next_fails(void *caller)
{
	unsigned long i = ++sh->n_allocs;

	if (i == sh->fail_at || i == sh->trace_at) {
		in_hook++;
		sh->bt_n = backtrace(sh->bt, BT_DEPTH);
		in_hook--;
	}
	if (i != sh->fail_at)
		return false;
	sh->hit = true;
	sh->fail_in_rx = in_regcomp > 0;
	sh->fail_site = caller;
	sh->rx_caller = in_regcomp ? regcomp_caller : NULL;
	return true;
}

static bool traced(void)
{
	return tracing && !in_hook;
}

static void *do_malloc(size_t n, void *caller)
{
	void *p;

	if (!traced())
		return __libc_malloc(n);
	if (next_fails(caller)) {
		errno = ENOMEM;
		return NULL;
	}
	p = __libc_malloc(n);
	if (p)
		set_add(p, sh->n_allocs, in_regcomp > 0);
	return p;
}

void *malloc(size_t n)
{
	return do_malloc(n, __builtin_return_address(0));
}

void *calloc(size_t n, size_t size)
{
	void *p;

	if (!traced())
		return __libc_calloc(n, size);
	if (next_fails(__builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL;
	}
	p = __libc_calloc(n, size);
	if (p)
		set_add(p, sh->n_allocs, in_regcomp > 0);
	return p;
}

void *realloc(void *old, size_t n)
{
	bool mine;
	void *p;

	if (!traced())
		return __libc_realloc(old, n);
	if (old && n == 0) { /* glibc: frees, returns NULL */
		set_del(old);
		__libc_free(old);
		return NULL;
	}
	if (next_fails(__builtin_return_address(0))) {
		errno = ENOMEM;
		return NULL; /* old stays valid */
	}
	/* A block from before the run (a libc cache) stays untracked. */
	mine = !old || set_del(old);
	p = __libc_realloc(old, n);
	if (mine && (p || old))
		set_add(p ? p : old, sh->n_allocs, in_regcomp > 0);
	return p;
}

void free(void *p)
{
	if (p && tracing)
		set_del(p);
	__libc_free(p);
}

static void *aligned(size_t align, size_t n, void *caller)
{
	void *p;

	if (!traced())
		return __libc_memalign(align, n);
	if (next_fails(caller))
		return NULL;
	p = __libc_memalign(align, n);
	if (p)
		set_add(p, sh->n_allocs, in_regcomp > 0);
	return p;
}

void *memalign(size_t align, size_t n)
{
	void *p = aligned(align, n, __builtin_return_address(0));

	if (!p)
		errno = ENOMEM;
	return p;
}

void *aligned_alloc(size_t align, size_t n)
{
	void *p = aligned(align, n, __builtin_return_address(0));

	if (!p)
		errno = ENOMEM;
	return p;
}

int posix_memalign(void **out, size_t align, size_t n)
{
	void *p;

	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	p = aligned(align, n, __builtin_return_address(0));
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

/* glibc's regcomp() (2.36 at least) leaks a block or two when one of its
 * own allocations fails.  Not flexfs's to fix: blocks made inside it are
 * marked, and their leak is only counted when the failure hit regcomp. */
static int (*real_regcomp)(regex_t *, const char *, int);

int regcomp(regex_t *restrict rx, const char *restrict re, int flags)
{
	int rc;

	if (!in_regcomp++)
		regcomp_caller = __builtin_return_address(0);
	rc = real_regcomp(rx, re, flags);
	in_regcomp--;
	return rc;
}

/* jansson, explicitly through the hooks */

/* ---- one run of the whole path ---- */

/* Inodes, bytes and index.json of a tree: a run that absorbed its failed
 * allocation must have built the same tree as one without a failure.
 * (Reading is not part of the path under test: not counted.) */
static uint64_t fingerprint(const flx_fs *fs)
{
	static unsigned char buf[1 << 16];
	uint64_t h = 1469598103934665603ull, off = 0;
	flx_stat st;
	ssize_t got;

	in_hook++;
	h = (h ^ flx_fs_inode_count(fs)) * 1099511628211ull;
	h = (h ^ flx_fs_total_bytes(fs)) * 1099511628211ull;
	if (flx_fs_resolve(fs, "index.json", &st)) {
		in_hook--;
		return 0;
	}
	while ((got = flx_fs_read(fs, st.ino, buf, sizeof(buf), off, NULL)) >
	       0) {
		for (ssize_t i = 0; i < got; i++)
			h = (h ^ buf[i]) * 1099511628211ull;
		off += (uint64_t)got;
	}
	in_hook--;
	return got < 0 || off != st.size ? 0 : h;
}

static void run_path(struct outcome *o)
{
	flx_spec s;
	flx_ckpt *c = NULL;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	int rc;

	flx_error_init(&o->err);
	o->stage = ST_SPEC_INIT;
	rc = flx_spec_init(&s);
	if (!rc) {
		o->stage = ST_SPEC;
		rc = flx_spec_set(&s, "tp", "3", &o->err);
		if (!rc)
			rc = flx_spec_set(&s, "pp", "2", &o->err);
		if (!rc)
			rc = flx_spec_set(&s, "rules", rules_file, &o->err);
	}
	if (!rc) {
		o->stage = ST_OPEN;
		rc = flx_ckpt_open_with(
		    ckpt_dir,
		    &(flx_ckpt_opts){.split_rule = flx_spec_split_rule,
				     .split_ctx = &s},
		    &c, &o->err);
	}
	if (!rc) {
		o->stage = ST_PLAN;
		rc = flx_plan_build(c, &s, &p, &o->err);
	}
	if (!rc) {
		o->stage = ST_FS;
		rc = flx_fs_build(c, p, &fs, &o->err);
	}
	if (!rc) {
		o->stage = ST_DONE;
		o->tree = fingerprint(fs);
	}
	flx_fs_free(fs);
	flx_plan_free(p);
	flx_ckpt_close(c);
	flx_spec_release(&s);
	o->rc = rc;
}

/* The traced run itself; the set is empty before and after. */
static void run_here(void)
{
	tracing = true;
	run_path(&sh->o);
	tracing = false;
	sh->o.allocs = sh->n_allocs;
	sh->set_full = set_full;
	for (size_t i = 0; set_live && i < SET_SIZE; i++) {
		struct slot *e = &set[i];

		if (!e->p)
			continue;
		if (e->rx && sh->fail_in_rx) {
			sh->o.glibc_leaked++;
		} else {
			sh->o.leaked++;
			if (!sh->o.first_leak || e->idx < sh->o.first_leak)
				sh->o.first_leak = e->idx;
		}
		e->p = NULL;
		set_live--;
	}
}

static void run_setup(unsigned long fail, unsigned long trace)
{
	memset(sh, 0, sizeof(*sh));
	sh->fail_at = fail;
	sh->trace_at = trace;
	sh->o.rc = 1; /* not reached */
}

/* Run with allocation number fail (0: none) failing, in a child. */
static void run_traced(unsigned long fail, unsigned long trace,
		       struct outcome *o)
{
	int status = 0;
	pid_t pid;

	run_setup(fail, trace);
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid == 0) {
		alarm(RUN_ALARM_S);
		run_here();
		_exit(0);
	}
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR) {
			perror("waitpid");
			exit(1);
		}
	*o = sh->o;
	o->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
	if (o->signal || !WIFEXITED(status) || WEXITSTATUS(status)) {
		o->allocs = sh->n_allocs;
		o->leaked = 0;
		if (!o->signal)
			o->signal = -1;
	}
}

/* ---- checks ---- */

enum problem {
	P_NONE,
	P_CRASH,
	P_HANG,
	P_LEAK,
	P_ERRNO,
	P_NOERR,
	P_CODE,
	P_NOMSG,
	P_CTRL,
	P_TREE,
};

static const char *const problem_names[] = {
    "",
    "crash",
    "hang",
    "leak",
    "wrong errno",
    "no error recorded",
    "err.code differs from the return value",
    "no error message",
    "control character in the error",
    "succeeded with a different tree",
};

static bool printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

static unsigned long glibc_leaks;
static uint64_t good_tree; /* of the run without a failure */

/* What is wrong with the outcome of run n, whose allocation n failed. */
static enum problem judge(const struct outcome *o, char *why, size_t len)
{
	why[0] = '\0';
	if (o->signal == SIGALRM) {
		snprintf(why, len, "no result after %u s", RUN_ALARM_S);
		return P_HANG;
	}
	if (o->signal) {
		snprintf(why, len, "the run died (%s)",
			 o->signal > 0 ? strsignal(o->signal)
				       : "bad exit status");
		return P_CRASH;
	}
	if (o->glibc_leaked)
		glibc_leaks++;
	if (o->leaked) {
		snprintf(why, len, "%zu allocation(s) leaked (oldest: #%lu)",
			 o->leaked, o->first_leak);
		return P_LEAK;
	}
	if (o->rc == 0 && o->tree != good_tree) {
		snprintf(why, len,
			 "the tree differs from the one built "
			 "without a failure");
		return P_TREE;
	}
	if (o->rc == 0)
		return P_NONE;
	if (o->rc != -ENOMEM) {
		snprintf(why, len, "returned %d (%s), not -ENOMEM", o->rc,
			 strerror(-o->rc));
		return P_ERRNO;
	}
	if (o->stage == ST_SPEC_INIT)
		return P_NONE; /* flx_spec_init has no flx_error to fill */
	if (o->err.code == 0) {
		snprintf(why, len, "-ENOMEM without an error recorded");
		return P_NOERR;
	}
	if (o->err.code != o->rc) {
		snprintf(why, len, "err.code is %d, the return value %d",
			 o->err.code, o->rc);
		return P_CODE;
	}
	if (!o->err.text[0]) {
		snprintf(why, len, "no error message");
		return P_NOMSG;
	}
	if (!printable(o->err.text) || !printable(o->err.file) ||
	    !printable(o->err.key)) {
		snprintf(why, len, "control character in the error");
		return P_CTRL;
	}
	return P_NONE;
}

/* The allocating frame in flexfs code: the first frame of this
 * executable's text at or above the direct caller of the hook (which may
 * be inside glibc or jansson); for regcomp(), flexfs's call of it. */
extern const char __executable_start[], etext[];

static void *core_frame(void)
{
	int i = 0;

	if (sh->rx_caller)
		return sh->rx_caller;
	while (i < sh->bt_n && sh->bt[i] != sh->fail_site)
		i++;
	for (; i < sh->bt_n; i++)
		if ((const char *)sh->bt[i] >= __executable_start &&
		    (const char *)sh->bt[i] < etext)
			return sh->bt[i];
	return sh->fail_site;
}

/* Problems are reported once per (kind, allocating flexfs frame). */
struct group {
	enum problem what;
	void *frame;
	unsigned long runs, first;
};

static struct group groups[MAX_GROUPS];
static size_t ngroups;
static unsigned long nproblems;

static void report(unsigned long n, const struct outcome *o, enum problem what,
		   const char *why)
{
	char line[4 * FLX_ERR_FIELD];
	void *frame = core_frame();
	struct group *g = NULL;

	nproblems++;
	check_failures++;
	for (size_t i = 0; i < ngroups && !g; i++)
		if (groups[i].what == what && groups[i].frame == frame)
			g = &groups[i];
	if (g) {
		g->runs++;
		return;
	}
	if (ngroups == MAX_GROUPS)
		return;
	g = &groups[ngroups++];
	*g =
	    (struct group){.what = what, .frame = frame, .runs = 1, .first = n};
	line[0] = '\0';
	if (!o->signal)
		flx_error_line(&o->err, line, sizeof(line));
	fprintf(stderr,
		"FAIL [%zu] %s: allocation #%lu (of %lu) failed in %s: "
		"rc=%d, error \"%s\": %s\n  the failed allocation:\n",
		ngroups, problem_names[what], n, o->allocs,
		stage_names[o->stage], o->rc, line, why);
	fflush(stderr);
	backtrace_symbols_fd(sh->bt, sh->bt_n, 2);
	if (what == P_LEAK) {
		struct outcome again;

		/* the same run again, keeping the oldest leaked block's
		 * origin */
		run_traced(n, o->first_leak, &again);
		fprintf(stderr, "  the oldest leaked allocation (#%lu):\n",
			o->first_leak);
		fflush(stderr);
		backtrace_symbols_fd(sh->bt, sh->bt_n, 2);
	}
}

static void summary(void)
{
	if (!ngroups)
		return;
	fprintf(stderr,
		"chaos: %lu failing run(s) in %zu group(s); per group: kind, "
		"runs, first run, allocating flexfs frame:\n",
		nproblems, ngroups);
	for (size_t i = 0; i < ngroups; i++) {
		fprintf(stderr, "  [%zu] %s, %lu run(s), first #%lu, at ",
			i + 1, problem_names[groups[i].what], groups[i].runs,
			groups[i].first);
		fflush(stderr);
		backtrace_symbols_fd(&groups[i].frame, 1, 2);
	}
	if (ngroups == MAX_GROUPS)
		fprintf(stderr, "  (more groups not listed)\n");
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t site_count;
static void *sites[MAX_SITES];

static void note_site(void *caller)
{
	for (size_t i = 0; i < site_count; i++)
		if (sites[i] == caller)
			return;
	if (site_count < MAX_SITES)
		sites[site_count++] = caller;
}

static unsigned long runs, ok_runs, enomem_runs;

/* Run n (allocation n fails) and judge it; false once allocation n is
 * past the end of the path. */
static bool exercise(unsigned long n)
{
	struct outcome o;
	enum problem what;
	char why[256];

	run_traced(n, 0, &o);
	if (!sh->hit && !o.signal)
		return false;
	runs++;
	note_site(sh->fail_site);
	if (o.rc == 0)
		ok_runs++;
	else if (o.rc == -ENOMEM)
		enomem_runs++;
	what = judge(&o, why, sizeof(why));
	if (what != P_NONE)
		report(n, &o, what, why);
	if (sh->set_full) {
		fprintf(stderr, "chaos: the pointer set overflowed\n");
		exit(1);
	}
	return true;
}

int main(int argc, char **argv)
{
	struct outcome o;
	unsigned long total, n, stride = 1;
	const char *env;
	double t0, per_run;
	bool more = true;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3) {
		ckpt_dir = argv[1];
		rules_file = argv[2];
	} else if (argc != 1) {
		fprintf(stderr, "usage: test_chaos [CKPT_DIR RULES_FILE]\n");
		return 2;
	}
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	real_regcomp =
	    (int (*)(regex_t *, const char *, int))dlsym(RTLD_NEXT, "regcomp");
	if (!real_regcomp) {
		fprintf(stderr, "dlsym(regcomp): %s\n", dlerror());
		return 1;
	}
	/* warm up: backtrace() loads libgcc_s; libc fills its caches */
	sh->bt_n = backtrace(sh->bt, BT_DEPTH);
	run_path(&o);
	good_tree = o.tree;
	if (o.rc || !good_tree) {
		char line[4 * FLX_ERR_FIELD];

		fprintf(stderr, "the path fails without any fault: %s\n",
			o.rc ? flx_error_line(&o.err, line, sizeof(line))
			     : "no index.json");
		return 1;
	}
	if ((env = getenv("FLX_CHAOS_ONLY")) && *env) {
		/* one run, here: no fork, for a debugger */
		char line[4 * FLX_ERR_FIELD];

		run_setup(strtoul(env, NULL, 10), 0);
		run_here();
		printf("chaos: allocation #%lu %s; %s returned %d (\"%s\"%s); "
		       "%zu block(s) leaked (+%zu by regcomp)\n",
		       sh->fail_at, sh->hit ? "failed" : "was not reached",
		       stage_names[sh->o.stage], sh->o.rc,
		       sh->o.rc ? flx_error_line(&sh->o.err, line, sizeof(line))
				: "",
		       sh->o.rc || sh->o.tree == good_tree
			   ? ""
			   : ", A DIFFERENT TREE",
		       sh->o.leaked, sh->o.glibc_leaked);
		return 0;
	}

	/* a clean traced run: the allocation count, and no leak */
	t0 = now_s();
	run_traced(0, 0, &o);
	per_run = now_s() - t0;
	total = o.allocs;
	if (o.rc || o.signal || o.leaked || o.tree != good_tree) {
		fprintf(stderr,
			"chaos: the traced run without a fault gave rc=%d, "
			"signal %d, %zu leaked, %s tree\n",
			o.rc, o.signal, o.leaked,
			o.tree == good_tree ? "the same" : "a different");
		return 1;
	}
	printf("chaos: the path makes %lu allocations (%.1f ms a run)\n", total,
	       per_run * 1e3);

	t0 = now_s();
	env = getenv("FLX_CHAOS_STRIDE");
	for (n = 1; more && n <= FULL_PREFIX; n++)
		more = exercise(n);
	if (more) {
		/* Each later run costs at most a whole run: pick k so that
		 * every k-th of the rest fits what is left of the budget (at
		 * least a quarter of it). */
		double left = TIME_BUDGET_S - (now_s() - t0);
		double rest = per_run * (double)(total - n + 1);

		if (left < TIME_BUDGET_S / 4)
			left = TIME_BUDGET_S / 4;
		stride = env && *env ? strtoul(env, NULL, 10)
				     : (unsigned long)(rest / left) + 1;
		if (stride < 1)
			stride = 1;
		if (stride > 1)
			printf("chaos: failed each of the first %lu "
			       "allocations; now failing every %lu-th "
			       "(FLX_CHAOS_STRIDE=1 for all)\n",
			       n - 1, stride);
	}
	for (; more; n += stride)
		more = exercise(n);
	printf("chaos: %lu allocation sites exercised (%zu distinct call "
	       "sites): %lu runs returned -ENOMEM, %lu absorbed the failure "
	       "and succeeded; %lu problem(s) in %zu group(s); %.1f s\n",
	       runs, site_count, enomem_runs, ok_runs, nproblems, ngroups,
	       now_s() - t0);
	if (glibc_leaks)
		printf("chaos: in %lu run(s) glibc's regcomp() leaked when "
		       "its allocation failed (a glibc bug; not counted)\n",
		       glibc_leaks);
	summary();
	CHECK(runs > 0);
	return CHECK_RESULT();
}

#endif
