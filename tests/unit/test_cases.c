/* SPDX-License-Identifier: MIT */
/*
 * Mount-time validation corpus (tests/cases/, see its README.md).
 *
 * Every directory under cases/invalid and cases/valid is one case: the base
 * fixture (fixtures/dcp-t113/ckpt, or the one its "base" file names) is
 * hard-linked from this run's own copy of it (never from the fixture: a
 * link moves the linked file's ctime) into a fresh temporary directory, its
 * subdirectories recreated; the case's files are overlaid (a subdirectory of
 * the case overlays the one of its name), its "setup" is applied (names may
 * be relative paths into subdirectories), and the result is opened
 * with flx_ckpt_open() (and planned with tp=2, or its "tp=", and no rules for
 * "stage=plan").
 * The outcome must match "expected": "ok", or the errno, and substrings of the
 * error's key, text and file.  Every refusal must in addition be one line that
 * names a file and gives a reason.  Valid cases must read back every tensor
 * exactly as the truth beside the base (its ../truth) has it.  Every base
 * fixture used must be byte-for-byte unchanged at the end.
 *
 * Runs from tests/ (ctest's working directory).  FLX_CASES_TMPDIR or TMPDIR
 * picks where the temporary directories go (default /tmp).
 *
 * Usage: test_cases [--threads N] [--async] [--walk] [--keep-fds N]
 *                   [--keep DIR]
 *   --threads N  open with flx_ckpt_opts.threads = N (the metadata decoded
 *                and the items read by N threads: the same outcome)
 *   --walk       resolve paths by the component walk alone
 *                (flx_ckpt_opts.walk_only, as without openat2())
 *   --keep-fds N only N files keep their descriptor from the open, the
 *                others are opened on use through the fd table of 4 slots
 *                (flx_ckpt_opts.keep_fds, as past RLIMIT_NOFILE)
 *   --keep DIR   also leave every assembled case in DIR/flx-cases.XXXXXX/
 *                <kind>.<case>/ with its tp in <kind>.<case>.tp (for
 *                the mount and flexfs-inspect to be run over the corpus)
 *   --async      open as the daemon does: flx_ckpt_open_start(), the plan
 *                (tp=2) while the items are read, then flx_ckpt_finish(),
 *                whose item failure is reported before a plan failure
 */
#include "check.h"
#include "ckpt.h"
#include "plan.h"
#include "spec.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CASES_DIR "cases"
#define FIXTURES  "fixtures"
#define BASE_DIR  "dcp-t113/ckpt" /* the default base, under FIXTURES */
#define FIELD	  256
#define MAX_BASES 64

/* ---- small file helpers ---- */

/* snprintf for paths: a truncated path is a harness bug, never silent. */
static void fmt_path(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fmt_path(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= len) {
		fprintf(stderr, "path too long: %s\n", buf);
		abort();
	}
}

/* Messages about what went wrong; truncation is harmless here. */
static void say(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void say(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (vsnprintf(buf, len, fmt, ap) < 0 && len)
		buf[0] = '\0';
	va_end(ap);
}

typedef struct names {
	char **v;
	size_t n;
} names;

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void names_free(names *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* Sorted entries of dir other than "." and ".."; 0 or -errno. */
static int list_dir(const char *dir, names *out)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t cap = 0;

	out->v = NULL;
	out->n = 0;
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (out->n == cap) {
			char **nv;

			cap = cap ? 2 * cap : 32;
			nv = realloc(out->v, cap * sizeof(*nv));
			if (!nv)
				abort();
			out->v = nv;
		}
		out->v[out->n] = strdup(de->d_name);
		if (!out->v[out->n])
			abort();
		out->n++;
	}
	closedir(d);
	if (out->n)
		qsort(out->v, out->n, sizeof(*out->v), cmp_name);
	return 0;
}

/* Whole file into a NUL-terminated buffer; NULL on error. */
static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t n = 0, cap = 0, r;

	if (!f)
		return NULL;
	do {
		if (cap - n < 4096) {
			char *nb;

			cap = cap ? 2 * cap : 8192;
			nb = realloc(buf, cap + 1);
			if (!nb)
				abort();
			buf = nb;
		}
		r = fread(buf + n, 1, cap - n, f);
		n += r;
	} while (r > 0);
	if (ferror(f)) {
		free(buf);
		fclose(f);
		return NULL;
	}
	fclose(f);
	if (!buf)
		buf = calloc(1, 1);
	buf[n] = '\0';
	if (len)
		*len = n;
	return buf;
}

/* Copy src to a new file dst (must not exist); 0 or -errno. */
static int copy_file(const char *src, const char *dst)
{
	char buf[65536];
	int in = open(src, O_RDONLY | O_CLOEXEC);
	int out = -1, rc = 0;
	ssize_t r;

	if (in < 0)
		return -errno;
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (out < 0) {
		rc = -errno;
		close(in);
		return rc;
	}
	while ((r = read(in, buf, sizeof(buf))) > 0) {
		if (write(out, buf, (size_t)r) != r) {
			rc = -EIO;
			break;
		}
	}
	if (r < 0)
		rc = -errno;
	close(in);
	if (close(out) && !rc)
		rc = -errno;
	return rc;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
		    struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP)
		return rmdir(path) ? -1 : 0;
	return unlink(path) ? -1 : 0;
}

static int rm_tree(const char *path)
{
	return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- snapshot of the base fixture ---- */

typedef struct fsnap {
	char *name;
	mode_t mode;
	off_t size;
	struct timespec mtime;
	uint64_t hash; /* FNV-1a 64 of the content */
} fsnap;

typedef struct snapshot {
	fsnap *f;
	size_t n;
} snapshot;

static uint64_t fnv1a(const char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* Append the entries under dir/sub (sub "" at the top) to s, names
 * relative to dir, each directory before what it holds. */
static int snapshot_tree(const char *dir, const char *sub, snapshot *s,
			 size_t *cap)
{
	char at[PATH_MAX];
	names l;
	int rc;

	fmt_path(at, sizeof(at), "%s%s%s", dir, *sub ? "/" : "", sub);
	rc = list_dir(at, &l);
	if (rc)
		return rc;
	for (size_t i = 0; i < l.n && !rc; i++) {
		char path[PATH_MAX], rel[PATH_MAX];
		struct stat st;
		fsnap *e;

		if (s->n == *cap) {
			fsnap *nf;

			*cap = *cap ? 2 * *cap : 32;
			nf = realloc(s->f, *cap * sizeof(*nf));
			if (!nf)
				abort();
			s->f = nf;
		}
		e = &s->f[s->n++];
		memset(e, 0, sizeof(*e));
		fmt_path(rel, sizeof(rel), "%s%s%s", sub, *sub ? "/" : "",
			 l.v[i]);
		fmt_path(path, sizeof(path), "%s/%s", dir, rel);
		e->name = strdup(rel);
		if (!e->name || lstat(path, &st))
			abort();
		e->mode = st.st_mode;
		e->size = st.st_size;
		e->mtime = st.st_mtim;
		if (S_ISREG(st.st_mode)) {
			size_t n;
			char *buf = slurp(path, &n);

			if (!buf)
				abort();
			e->hash = fnv1a(buf, n);
			free(buf);
		} else if (S_ISDIR(st.st_mode)) {
			rc = snapshot_tree(dir, rel, s, cap);
		}
	}
	names_free(&l);
	return rc;
}

/* Every entry under dir, subdirectories included. */
static int take_snapshot(const char *dir, snapshot *s)
{
	size_t cap = 0;

	s->f = NULL;
	s->n = 0;
	return snapshot_tree(dir, "", s, &cap);
}

static void snapshot_free(snapshot *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->f[i].name);
	free(s->f);
	s->f = NULL;
	s->n = 0;
}

/* 0 when equal; prints every difference. */
static int snapshot_diff(const snapshot *a, const snapshot *b)
{
	int diffs = 0;

	if (a->n != b->n) {
		fprintf(stderr, "base fixture: %zu entries before, %zu after\n",
			a->n, b->n);
		return 1;
	}
	for (size_t i = 0; i < a->n; i++) {
		const fsnap *x = &a->f[i], *y = &b->f[i];

		if (strcmp(x->name, y->name) || x->mode != y->mode ||
		    x->size != y->size || x->hash != y->hash ||
		    x->mtime.tv_sec != y->mtime.tv_sec ||
		    x->mtime.tv_nsec != y->mtime.tv_nsec) {
			fprintf(stderr, "base fixture: %s changed\n", x->name);
			diffs++;
		}
	}
	return diffs;
}

/* The base fixtures the cases used, each snapshotted before its first use
 * and compared at the end. */
static struct base_used {
	char rel[PATH_MAX]; /* under FIXTURES */
	snapshot before;
} bases[MAX_BASES];
static size_t nbases;

/* The case's base fixture (its "base" file, else BASE_DIR), checked to be
 * a plain relative path and snapshotted on first use.  0 or -1 with why. */
static int case_base(const char *casedir, char *rel, size_t len, char *why,
		     size_t whylen)
{
	char path[PATH_MAX], dir[PATH_MAX];
	char *buf;
	size_t k;

	fmt_path(path, sizeof(path), "%s/base", casedir);
	buf = slurp(path, NULL);
	fmt_path(rel, len, "%s", buf ? buf : BASE_DIR);
	free(buf);
	rel[strcspn(rel, "\n")] = '\0';
	if (!rel[0] || rel[0] == '/' || strstr(rel, "..")) {
		say(why, whylen, "base '%s' is not a path under %s", rel,
		    FIXTURES);
		return -1;
	}
	for (k = 0; k < nbases && strcmp(bases[k].rel, rel) != 0; k++)
		;
	if (k < nbases)
		return 0;
	fmt_path(dir, sizeof(dir), "%s/%s", FIXTURES, rel);
	if (nbases == MAX_BASES || take_snapshot(dir, &bases[k].before)) {
		say(why, whylen, "cannot snapshot base %s", dir);
		return -1;
	}
	fmt_path(bases[k].rel, sizeof(bases[k].rel), "%s", rel);
	nbases++;
	return 0;
}

/* ---- expected ---- */

typedef struct expect {
	bool ok;
	bool plan;
	int tp; /* the plan's tp: 2 unless "tp=" says */
	/* "src_strategy=": a MindSpore strategy file of the case (relative
	 * to the assembled directory), the open option ms_strategy */
	char src_strategy[FIELD];
	int code; /* positive errno */
	char key[FIELD];
	char text[FIELD];
	char file[FIELD];
	bool have_code, have_key, have_text, have_file;
} expect;

static const struct {
	const char *name;
	int value;
} errnos[] = {
    {"EINVAL", EINVAL},	    {"ENOENT", ENOENT},
    {"ENOTSUP", ENOTSUP},   {"EOPNOTSUPP", EOPNOTSUPP},
    {"ELOOP", ELOOP},	    {"EXDEV", EXDEV},
    {"EIO", EIO},	    {"EOVERFLOW", EOVERFLOW},
    {"ENOMEM", ENOMEM},	    {"EACCES", EACCES},
    {"EPERM", EPERM},	    {"ENOTDIR", ENOTDIR},
    {"EISDIR", EISDIR},	    {"ENAMETOOLONG", ENAMETOOLONG},
    {"E2BIG", E2BIG},	    {"ERANGE", ERANGE},
    {"EFBIG", EFBIG},	    {"EBADMSG", EBADMSG},
    {"EPROTO", EPROTO},	    {"ENODATA", ENODATA},
    {"EMSGSIZE", EMSGSIZE}, {"ENOEXEC", ENOEXEC},
    {"ESTALE", ESTALE},	    {"EEXIST", EEXIST},
};

static int errno_value(const char *name)
{
	for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
		if (!strcmp(errnos[i].name, name))
			return errnos[i].value;
	return 0;
}

static const char *errno_name(int value)
{
	for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
		if (errnos[i].value == value)
			return errnos[i].name;
	return "?";
}

static const char *const fields[] = {
    "code=", "key=", "text=", "file=", "stage=", "tp=", "src_strategy="};
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

/* Index of the field marker starting at line[p] (at the line start or after
 * a blank), or -1. */
static int field_at(const char *line, size_t p)
{
	if (p > 0 && line[p - 1] != ' ' && line[p - 1] != '\t')
		return -1;
	for (size_t f = 0; f < NFIELDS; f++)
		if (!strncmp(line + p, fields[f], strlen(fields[f])))
			return (int)f;
	return -1;
}

static int set_field(expect *e, int f, const char *v, size_t n, char *why,
		     size_t whylen)
{
	char val[FIELD];

	if (n >= sizeof(val)) {
		say(why, whylen, "value of %s too long", fields[f]);
		return -1;
	}
	memcpy(val, v, n);
	val[n] = '\0';
	switch (f) {
	case 0:
		e->code = errno_value(val);
		e->have_code = true;
		if (!e->code) {
			say(why, whylen, "unknown errno name '%s'", val);
			return -1;
		}
		break;
	case 1:
		/* "-": the key is not checked */
		e->have_key = strcmp(val, "-") != 0;
		snprintf(e->key, sizeof(e->key), "%s", val);
		break;
	case 2:
		e->have_text = true;
		snprintf(e->text, sizeof(e->text), "%s", val);
		break;
	case 3:
		e->have_file = true;
		snprintf(e->file, sizeof(e->file), "%s", val);
		break;
	case 6:
		if (!val[0] || val[0] == '/' || strstr(val, "..")) {
			say(why, whylen, "bad src_strategy '%s'", val);
			return -1;
		}
		snprintf(e->src_strategy, sizeof(e->src_strategy), "%s", val);
		break;
	case 5:
		e->tp = atoi(val);
		if (e->tp < 1 || e->tp > 64) {
			say(why, whylen, "bad tp '%s'", val);
			return -1;
		}
		break;
	default:
		if (!strcmp(val, "plan"))
			e->plan = true;
		else if (strcmp(val, "open") != 0) {
			say(why, whylen, "unknown stage '%s'", val);
			return -1;
		}
	}
	return 0;
}

/* One line: "ok", or fields "name=value" where a value runs to the next
 * " name=" of a known field or to the end of the line. */
static int parse_expect_line(expect *e, char *line, char *why, size_t whylen)
{
	size_t len = strlen(line), p = 0;
	int cur = -1;
	size_t vstart = 0;

	while (len && (line[len - 1] == ' ' || line[len - 1] == '\t' ||
		       line[len - 1] == '\r'))
		line[--len] = '\0';
	while (*line == ' ' || *line == '\t') {
		line++;
		len--;
	}
	if (!len || line[0] == '#')
		return 0;
	if (!strcmp(line, "ok")) {
		e->ok = true;
		return 0;
	}
	for (p = 0; p <= len; p++) {
		int f = p < len ? field_at(line, p) : -1;

		if (p < len && f < 0)
			continue;
		if (cur >= 0) {
			size_t end = p;

			while (end > vstart &&
			       (line[end - 1] == ' ' || line[end - 1] == '\t'))
				end--;
			if (set_field(e, cur, line + vstart, end - vstart, why,
				      whylen))
				return -1;
		} else if (p > 0 || f < 0) {
			say(why, whylen, "cannot parse line '%s'", line);
			return -1;
		}
		if (f >= 0) {
			cur = f;
			vstart = p + strlen(fields[f]);
		}
	}
	return 0;
}

static int parse_expect(const char *path, expect *e, char *why, size_t whylen)
{
	char *buf = slurp(path, NULL), *save = NULL, *line;
	int rc = 0;

	memset(e, 0, sizeof(*e));
	if (!buf) {
		say(why, whylen, "cannot read %s", path);
		return -1;
	}
	for (line = strtok_r(buf, "\n", &save); line && !rc;
	     line = strtok_r(NULL, "\n", &save))
		rc = parse_expect_line(e, line, why, whylen);
	free(buf);
	if (rc)
		return rc;
	if (e->ok &&
	    (e->have_code || e->have_key || e->have_text || e->have_file)) {
		say(why, whylen, "'ok' together with error fields");
		return -1;
	}
	if (!e->ok && (!e->have_code || !e->have_text)) {
		say(why, whylen, "needs 'ok' or code= and text=");
		return -1;
	}
	return 0;
}

/* ---- assembling a case directory ---- */

/* A relative path inside the case directory: one or more components
 * joined by '/', none empty, "." or "..". */
static bool plain_name(const char *n)
{
	const char *p = n;

	if (!*n)
		return false;
	for (;;) {
		const char *e = strchr(p, '/');
		size_t k = e ? (size_t)(e - p) : strlen(p);

		if (!k || (k == 1 && p[0] == '.') ||
		    (k == 2 && p[0] == '.' && p[1] == '.'))
			return false;
		if (!e)
			return true;
		p = e + 1;
	}
}

/* Where the base fixtures' files are copied once per run ("" before). */
static char stage_root[PATH_MAX];

/* dst := a hard link to this run's own copy of src, never to src itself:
 * a link moves the ctime of the file linked, which a mount of the base
 * fixture at the same time (another test) must take for a change
 * (flx_file_verify()). */
static int copy_in(const char *src, const char *dst)
{
	char staged[PATH_MAX], *p;
	int rc;

	fmt_path(staged, sizeof(staged), "%s/", stage_root);
	p = staged + strlen(staged);
	fmt_path(p, sizeof(staged) - (size_t)(p - staged), "%s", src);
	for (; *p; p++)
		if (*p == '/')
			*p = '%';
	rc = copy_file(src, staged);
	if (rc && rc != -EEXIST)
		return rc;
	if (!link(staged, dst))
		return 0;
	if (errno != EXDEV && errno != EPERM && errno != EMLINK)
		return -errno;
	return copy_file(staged, dst);
}

/* Replace dir/name (possibly a hard link into the base) by its own copy. */
static int unshare(const char *dir, const char *name)
{
	char path[PATH_MAX], tmp[PATH_MAX];
	int rc;

	fmt_path(path, sizeof(path), "%s/%s", dir, name);
	fmt_path(tmp, sizeof(tmp), "%s/.unshare.tmp", dir);
	rc = copy_file(path, tmp);
	if (!rc && rename(tmp, path))
		rc = -errno;
	return rc;
}

/* Expand a leading @BASE@ / @DIR@ of a symlink target. */
static void expand(char *out, size_t len, const char *t, const char *base,
		   const char *dir)
{
	if (!strncmp(t, "@BASE@", 6))
		fmt_path(out, len, "%s%s", base, t + 6);
	else if (!strncmp(t, "@DIR@", 5))
		fmt_path(out, len, "%s%s", dir, t + 5);
	else
		fmt_path(out, len, "%s", t);
}

/* A bound unix socket at path (the descriptor closed, the node stays). */
static int make_socket(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, rc;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -1 : 0;
	close(fd);
	return rc;
}

static int apply_setup(const char *path, const char *dir, const char *base,
		       char *why, size_t whylen)
{
	char *buf = slurp(path, NULL), *save = NULL, *line;
	char realdir[PATH_MAX];
	int rc = 0;

	if (!buf)
		return 0; /* no setup file */
	if (!realpath(dir, realdir)) {
		free(buf);
		say(why, whylen, "realpath(%s) failed", dir);
		return -1;
	}
	for (line = strtok_r(buf, "\n", &save); line && !rc;
	     line = strtok_r(NULL, "\n", &save)) {
		char op[32], a[PATH_MAX], b[PATH_MAX], target[PATH_MAX];
		char pa[PATH_MAX], pb[PATH_MAX];
		int n;

		while (*line == ' ' || *line == '\t')
			line++;
		if (!*line || *line == '#' || *line == '\r')
			continue;
		n = sscanf(line, "%31s %4095s %4095s", op, a, b);
		if (n < 2 || !plain_name(a)) {
			say(why, whylen, "setup: bad line '%s'", line);
			rc = -1;
			break;
		}
		fmt_path(pa, sizeof(pa), "%s/%s", dir, a);
		if (!strcmp(op, "remove") && n == 2) {
			if (unlink(pa) && (errno != EISDIR || rmdir(pa)))
				rc = -1;
		} else if (!strcmp(op, "mkdir") && n == 2) {
			rc = mkdir(pa, 0755) ? -1 : 0;
		} else if (!strcmp(op, "mkfifo") && n == 2) {
			rc = mkfifo(pa, 0644) ? -1 : 0;
		} else if (!strcmp(op, "socket") && n == 2) {
			rc = make_socket(pa);
		} else if (!strcmp(op, "rename") && n == 3 && plain_name(b)) {
			fmt_path(pb, sizeof(pb), "%s/%s", dir, b);
			rc = rename(pa, pb) ? -1 : 0;
		} else if (!strcmp(op, "symlink") && n == 3) {
			expand(target, sizeof(target), b, base, realdir);
			rc = symlink(target, pa) ? -1 : 0;
		} else if (!strcmp(op, "truncate") && n == 3) {
			char *end;
			long long sz = strtoll(b, &end, 10);

			if (*end || sz < 0) {
				say(why, whylen, "setup: bad size '%s'", b);
				rc = -1;
				break;
			}
			/* never truncate the base through a hard link */
			rc = unshare(dir, a);
			if (!rc && truncate(pa, (off_t)sz))
				rc = -1;
		} else {
			say(why, whylen, "setup: unknown line '%s'", line);
			rc = -1;
			break;
		}
		if (rc)
			say(why, whylen, "setup: '%s' failed: %s", line,
			    strerror(errno));
	}
	free(buf);
	return rc;
}

/* dst (created) := src's files as copy_in() links them, subdirectories
 * recreated and filled the same way. */
static int link_tree(const char *src, const char *dst, char *why, size_t whylen)
{
	char from[PATH_MAX], to[PATH_MAX];
	struct stat st;
	names l;
	int rc;

	if (mkdir(dst, 0755)) {
		say(why, whylen, "mkdir %s: %s", dst, strerror(errno));
		return -1;
	}
	if ((rc = list_dir(src, &l))) {
		say(why, whylen, "cannot list %s: %s", src, strerror(-rc));
		return -1;
	}
	for (size_t i = 0; i < l.n && !rc; i++) {
		fmt_path(from, sizeof(from), "%s/%s", src, l.v[i]);
		fmt_path(to, sizeof(to), "%s/%s", dst, l.v[i]);
		if (!lstat(from, &st) && S_ISDIR(st.st_mode)) {
			rc = link_tree(from, to, why, whylen);
			continue;
		}
		if ((rc = copy_in(from, to)))
			say(why, whylen, "link %s: %s", from, strerror(-rc));
	}
	names_free(&l);
	return rc ? -1 : 0;
}

/* Overlay the files under src on dst, each as a new file (never written
 * through a link into the base); a subdirectory of src overlays the
 * directory of its name, created when the base has none.  top: src is the
 * case directory, whose expected, setup and base are not overlaid. */
static int overlay_tree(const char *src, const char *dst, bool top, char *why,
			size_t whylen)
{
	char from[PATH_MAX], to[PATH_MAX];
	struct stat st;
	names l;
	int rc;

	if ((rc = list_dir(src, &l))) {
		say(why, whylen, "cannot list %s", src);
		return -1;
	}
	for (size_t i = 0; i < l.n && !rc; i++) {
		if (top &&
		    (!strcmp(l.v[i], "expected") || !strcmp(l.v[i], "setup") ||
		     !strcmp(l.v[i], "base")))
			continue;
		fmt_path(from, sizeof(from), "%s/%s", src, l.v[i]);
		fmt_path(to, sizeof(to), "%s/%s", dst, l.v[i]);
		if (!lstat(from, &st) && S_ISDIR(st.st_mode)) {
			if (mkdir(to, 0755) && errno != EEXIST) {
				say(why, whylen, "mkdir %s: %s", to,
				    strerror(errno));
				rc = -1;
			} else {
				rc = overlay_tree(from, to, false, why, whylen);
			}
			continue;
		}
		if (unlink(to) && errno != ENOENT)
			rc = -errno;
		if (!rc)
			rc = copy_file(from, to);
		if (rc)
			say(why, whylen, "overlay %s: %s", from, strerror(-rc));
	}
	names_free(&l);
	return rc ? -1 : 0;
}

/* dir := base fixture (basedir; base: its absolute path) + the case's
 * files, subdirectories included; then setup. */
static int assemble(const char *casedir, const char *dir, const char *basedir,
		    const char *base, char *why, size_t whylen)
{
	char src[PATH_MAX];

	if (link_tree(basedir, dir, why, whylen) ||
	    overlay_tree(casedir, dir, true, why, whylen))
		return -1;
	fmt_path(src, sizeof(src), "%s/setup", casedir);
	return apply_setup(src, dir, base, why, whylen);
}

/* ---- checks ---- */

/* Every tensor of an accepted checkpoint must read back as the truth (a
 * directory of <fqn>.bin). */
static int verify_data(const flx_ckpt *c, const char *truthdir, char *why,
		       size_t whylen)
{
	for (size_t i = 0; i < c->ntensors; i++) {
		const flx_tensor *t = &c->tensors[i];
		char path[PATH_MAX];
		flx_view *v = NULL;
		flx_error err;
		flx_box box;
		size_t n;
		char *truth, *buf;
		ssize_t got;

		fmt_path(path, sizeof(path), "%s/%s.bin", truthdir, t->fqn);
		truth = slurp(path, &n);
		if (!truth) {
			say(why, whylen, "no truth for %s", t->fqn);
			return -1;
		}
		memset(&box, 0, sizeof(box));
		memcpy(box.size, t->shape, sizeof(box.size));
		flx_error_init(&err);
		if (flx_view_new(c, t, &box, &v, &err)) {
			say(why, whylen, "%s: view: %s", t->fqn, err.text);
			free(truth);
			return -1;
		}
		buf = malloc(n + 1);
		if (!buf)
			abort();
		got = flx_view_read(v, buf, n + 1, 0, NULL);
		flx_view_free(v);
		if (got != (ssize_t)n || memcmp(buf, truth, n) != 0) {
			say(why, whylen,
			    "%s: read %zd bytes differing from the "
			    "truth (%zu bytes)",
			    t->fqn, got, n);
			free(buf);
			free(truth);
			return -1;
		}
		free(buf);
		free(truth);
	}
	return 0;
}

/* A refusal must be one printable line that names a file and a reason. */
static int check_shape(const flx_error *err, int rc, const char *line,
		       char *why, size_t whylen)
{
	if (err->code != rc) {
		say(why, whylen, "err.code %d but returned %d", err->code, rc);
		return -1;
	}
	for (const char *p = line; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f) {
			say(why, whylen,
			    "control character 0x%02x in the error line",
			    (unsigned char)*p);
			return -1;
		}
	if (!err->file[0]) {
		say(why, whylen, "the error names no file");
		return -1;
	}
	if (!err->text[0]) {
		say(why, whylen, "the error has no reason");
		return -1;
	}
	return 0;
}

static int compare(const expect *e, const flx_error *err, int rc, char *why,
		   size_t whylen)
{
	if (e->ok) {
		say(why, whylen, "expected ok");
		return -1;
	}
	if (rc != -e->code) {
		say(why, whylen, "expected %s, got %s (%d)",
		    errno_name(e->code), errno_name(-rc), rc);
		return -1;
	}
	if (e->have_key && !strstr(err->key, e->key)) {
		say(why, whylen, "key does not contain \"%s\"", e->key);
		return -1;
	}
	if (e->have_text && !strstr(err->text, e->text)) {
		say(why, whylen, "text does not contain \"%s\"", e->text);
		return -1;
	}
	if (e->have_file && !strstr(err->file, e->file)) {
		say(why, whylen, "file does not contain \"%s\"", e->file);
		return -1;
	}
	return 0;
}

/* How every case is opened (the command line). */
static flx_ckpt_opts open_opts;
static const char *keep_dir; /* --keep */

/* Leave the assembled case dir with its tp beside it (--keep). */
static int keep_case(const char *dir, int tp)
{
	char path[PATH_MAX];
	FILE *f;

	fmt_path(path, sizeof(path), "%s.tp", dir);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f, "%d\n", tp ? tp : 2);
	return fclose(f);
}

/* Run one case; 0 when it passes.  Prints its line. */
static int run_case(const char *kind, const char *name, const char *tmproot)
{
	bool async = open_opts.defer_items;
	char casedir[PATH_MAX], dir[PATH_MAX], path[PATH_MAX];
	char rel[PATH_MAX], basedir[PATH_MAX], base[PATH_MAX], truth[PATH_MAX];
	char strategy[PATH_MAX];
	flx_ckpt_opts opts = open_opts;
	flx_opt_vals vals = {0};
	char why[512] = "", line[4 * FLX_ERR_FIELD];
	flx_ckpt *c = NULL;
	flx_plan *p = NULL;
	flx_error err;
	expect e;
	int rc = 0, bad = 0;

	fmt_path(casedir, sizeof(casedir), "%s/%s/%s", CASES_DIR, kind, name);
	fmt_path(dir, sizeof(dir), "%s/%s.%s", tmproot, kind, name);
	fmt_path(path, sizeof(path), "%s/expected", casedir);
	line[0] = '\0';
	flx_error_init(&err);
	if (parse_expect(path, &e, why, sizeof(why)) ||
	    case_base(casedir, rel, sizeof(rel), why, sizeof(why))) {
		printf("FAIL %s/%s: harness: %s\n", kind, name, why);
		bad = 1;
		goto out;
	}
	fmt_path(basedir, sizeof(basedir), "%s/%s", FIXTURES, rel);
	/* the truth lies beside the base: <fixture>/truth */
	fmt_path(truth, sizeof(truth), "%s/%s", FIXTURES, rel);
	*strrchr(truth, '/') = '\0';
	fmt_path(truth + strlen(truth), sizeof(truth) - strlen(truth),
		 "/truth");
	if (!realpath(basedir, base) ||
	    assemble(casedir, dir, basedir, base, why, sizeof(why))) {
		printf("FAIL %s/%s: harness: %s\n", kind, name, why);
		bad = 1;
		goto out;
	}
	if (keep_dir && keep_case(dir, e.tp)) {
		printf("FAIL %s/%s: harness: cannot keep %s\n", kind, name,
		       dir);
		bad = 1;
	}
	if (e.ok != !strcmp(kind, "valid")) {
		printf("FAIL %s/%s: harness: %s case expects %s\n", kind, name,
		       kind, e.ok ? "ok" : "an error");
		bad = 1;
	}
	/* --async: as the daemon does it, the plan is built while the items
	 * are read, and an item failure still wins */
	if (e.src_strategy[0]) {
		fmt_path(strategy, sizeof(strategy), "%s/%s", dir,
			 e.src_strategy);
		if (flx_ckpt_opt_set(&vals, "src_strategy", strategy, NULL)) {
			printf("FAIL %s/%s: harness: src_strategy\n", kind,
			       name);
			bad = 1;
			goto out;
		}
		opts.vals = &vals;
	}
	rc = flx_ckpt_open_with(dir, &opts, &c, &err);
	if (!rc && (e.plan || async)) {
		flx_spec s;

		char tp[16];

		/* tp=2 (or the case's), pp=1, no rules */
		snprintf(tp, sizeof(tp), "%d", e.tp ? e.tp : 2);
		if (flx_spec_init(&s) || flx_spec_set(&s, "tp", tp, &err)) {
			printf("FAIL %s/%s: harness: spec setup\n", kind, name);
			bad = 1;
		} else {
			rc = flx_plan_build(c, &s, &p, &err);
			flx_plan_free(p);
		}
		flx_spec_release(&s);
		/* a case not meant to be planned fails the plan only
		 * when an item is bad: what finish reports */
		if (rc && !e.plan)
			rc = 0;
	}
	if (async && c) {
		flx_error ierr;
		int irc;

		flx_error_init(&ierr);
		irc = flx_ckpt_finish(c, &ierr);
		if (irc) {
			err = ierr;
			rc = irc;
		}
	}
	if (rc) {
		flx_error_line(&err, line, sizeof(line));
		if (check_shape(&err, rc, line, why, sizeof(why)) ||
		    compare(&e, &err, rc, why, sizeof(why)))
			bad = 1;
	} else if (!e.ok) {
		say(why, sizeof(why), "accepted; expected %s: %s",
		    errno_name(e.code), e.text);
		bad = 1;
	} else if (verify_data(c, truth, why, sizeof(why))) {
		bad = 1;
	}
	if (bad)
		printf("FAIL %s/%s: got \"%s\"; %s\n", kind, name, line, why);
	else
		printf("ok %s/%s%s%s\n", kind, name, rc ? ": " : "", line);
out:
	flx_ckpt_close(c);
	flx_opt_vals_release(&vals);
	if (!keep_dir && rm_tree(dir) && errno != ENOENT) {
		printf("FAIL %s/%s: harness: cannot remove %s\n", kind, name,
		       dir);
		bad = 1;
	}
	return bad;
}

int main(int argc, char **argv)
{
	static const char *const kinds[] = {"invalid", "valid"};
	const char *tmp = getenv("FLX_CASES_TMPDIR");
	char tmproot[PATH_MAX], base[PATH_MAX];
	size_t ncases[2] = {0, 0};

	setvbuf(stdout, NULL, _IOLBF, 0); /* interleave with stderr */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--walk") == 0) {
			open_opts.walk_only = true;
		} else if (strcmp(argv[i], "--keep-fds") == 0 && i + 1 < argc &&
			   atoi(argv[i + 1]) > 0) {
			open_opts.keep_fds = (unsigned)atoi(argv[++i]);
		} else if (strcmp(argv[i], "--keep") == 0 && i + 1 < argc) {
			keep_dir = argv[++i];
		} else if (strcmp(argv[i], "--async") == 0) {
			open_opts.defer_items = true;
		} else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc &&
			   atoi(argv[i + 1]) > 0) {
			open_opts.threads = (unsigned)atoi(argv[++i]);
		} else {
			fprintf(stderr, "usage: test_cases [--threads N] "
					"[--async] [--walk] [--keep-fds N] "
					"[--keep DIR]\n");
			return 2;
		}
	}
	if (keep_dir)
		tmp = keep_dir;
	if (!tmp || !*tmp)
		tmp = getenv("TMPDIR");
	if (!tmp || !*tmp)
		tmp = "/tmp";
	fmt_path(base, sizeof(base), "%s/%s", FIXTURES, BASE_DIR);
	if (access(base, R_OK)) {
		fprintf(stderr, "%s: %s (run from tests/)\n", base,
			strerror(errno));
		return 1;
	}
	fmt_path(tmproot, sizeof(tmproot), "%s/flx-cases.XXXXXX", tmp);
	if (!mkdtemp(tmproot)) {
		fprintf(stderr, "mkdtemp %s: %s\n", tmproot, strerror(errno));
		return 1;
	}
	fmt_path(stage_root, sizeof(stage_root), "%s/base-copies", tmproot);
	if (mkdir(stage_root, 0755)) {
		fprintf(stderr, "mkdir %s: %s\n", stage_root, strerror(errno));
		return 1;
	}
	for (size_t k = 0; k < 2; k++) {
		char dir[PATH_MAX];
		names l;

		fmt_path(dir, sizeof(dir), "%s/%s", CASES_DIR, kinds[k]);
		CHECK_EQ(list_dir(dir, &l), 0);
		for (size_t i = 0; i < l.n; i++) {
			if (run_case(kinds[k], l.v[i], tmproot))
				check_failures++;
			ncases[k]++;
		}
		names_free(&l);
	}
	printf("%zu invalid and %zu valid cases\n", ncases[0], ncases[1]);
	CHECK(ncases[0] > 0);
	CHECK(ncases[1] > 0);
	if (!keep_dir)
		CHECK_EQ(rm_tree(tmproot), 0);
	for (size_t k = 0; k < nbases; k++) {
		snapshot after;

		fmt_path(base, sizeof(base), "%s/%s", FIXTURES, bases[k].rel);
		CHECK_EQ(take_snapshot(base, &after), 0);
		CHECK_EQ(snapshot_diff(&bases[k].before, &after), 0);
		snapshot_free(&bases[k].before);
		snapshot_free(&after);
	}
	return CHECK_RESULT();
}
