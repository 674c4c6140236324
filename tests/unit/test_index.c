/* SPDX-License-Identifier: MIT */
/*
 * The index builder and its source table (resolver/index.c, sources.c):
 *  - the DCP fixture opens to the same index with 1, 3 and automatic
 *    threads (the thread count is an open option, not an environment
 *    variable);
 *  - its dense chunks' strides (those of their sizes stored row-major,
 *    recomputed here) are one array shared by the chunks of a tensor in a
 *    row whose sizes give the same (flx_tensor_pool_place()), so a
 *    million chunks do not keep a million copies; a chunk torch saved
 *    transposed has its own, strided;
 *  - format detection: each fixture opens as its own format, a forced
 *    format is obeyed, an unknown one refused, and a directory no source
 *    recognises gets one line naming what each looks for;
 *  - the Hugging Face source: every tensor one dense chunk whose data lies
 *    where the header says (parsed here independently with jansson), and
 *    whose bytes equal the truth; the same tensors from one file and from
 *    three shards; extras recorded as such; no items to wait for;
 *  - flx_access_meet() against the kernel's rule applied to every user of
 *    a small world: whoever the result lets read could read both, and
 *    with one owner and group exactly those who could;
 *  - the walks over a directory's top names (resolver/dirview.c): over a
 *    sorted list of paths and over the directory itself, each against
 *    the names the kernel lists for the same paths made in a temporary
 *    directory; a cap on the subdirectories, on their names' length and
 *    a callback that stops the walk.
 * Runs from tests/ (ctest's working directory).
 */
#include "check.h"
#include "ckpt.h"
#include "source.h"

#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DCP	 "fixtures/dcp-t113/ckpt"
#define HF	 "fixtures/hf-tiny/single"
#define HF_SH	 "fixtures/hf-tiny/sharded"
#define HF_TRUTH "fixtures/hf-tiny/truth"

static flx_ckpt *open_ok(const char *dir, const flx_ckpt_opts *o)
{
	flx_ckpt *c = NULL;
	flx_error err;
	int rc;

	flx_error_init(&err);
	rc = flx_ckpt_open_with(dir, o, &c, &err);
	if (rc) {
		char line[4 * FLX_ERR_FIELD];

		fprintf(stderr, "open %s: %s\n", dir,
			flx_error_line(&err, line, sizeof(line)));
	}
	CHECK_EQ(rc, 0);
	return c;
}

static int open_fails(const char *dir, const flx_ckpt_opts *o, flx_error *err)
{
	flx_ckpt *c = NULL;
	int rc;

	flx_error_init(err);
	rc = flx_ckpt_open_with(dir, o, &c, err);
	CHECK(rc < 0);
	CHECK(c == NULL);
	CHECK_EQ(err->code, rc);
	return rc;
}

/* Two indexes hold the same tensors, chunks and data locations. */
static void check_same(const flx_ckpt *a, const flx_ckpt *b)
{
	CHECK_EQ(a->ntensors, b->ntensors);
	CHECK_EQ(a->nobjects, b->nobjects);
	CHECK_EQ(a->nfiles, b->nfiles);
	for (size_t i = 0; i < a->ntensors && i < b->ntensors; i++) {
		const flx_tensor *x = &a->tensors[i], *y = &b->tensors[i];

		CHECK_STR(x->fqn, y->fqn);
		CHECK_EQ(x->nchunks, y->nchunks);
		for (uint32_t k = 0; k < x->nchunks && k < y->nchunks; k++) {
			const flx_chunk *p = &x->chunks[k], *q = &y->chunks[k];

			CHECK_EQ(p->file, q->file);
			CHECK_EQ(p->data_off, q->data_off);
			CHECK_EQ(p->storage_offset, q->storage_offset);
			CHECK_EQ(p->contig_from, q->contig_from);
			for (int d = 0; d < x->ndim; d++)
				CHECK_EQ(p->stride[d], q->stride[d]);
		}
	}
}

static void test_dcp_threads(void)
{
	flx_ckpt_opts one = {.threads = 1}, three = {.threads = 3};
	flx_ckpt *a = open_ok(DCP, NULL), *b = open_ok(DCP, &one),
		 *c = open_ok(DCP, &three);

	if (a && b && c) {
		CHECK_STR(a->format, "torch-dcp");
		CHECK(a->ntensors > 10);
		check_same(a, b);
		check_same(a, c);
	}
	flx_ckpt_close(a);
	flx_ckpt_close(b);
	flx_ckpt_close(c);
}

/* Whether ch's strides are those of its size stored dense row-major. */
static bool dense(const flx_tensor *t, const flx_chunk *ch)
{
	int64_t s = 1;

	for (int d = t->ndim - 1; d >= 0; d--) {
		if (ch->stride[d] != s)
			return false;
		s *= ch->size[d];
	}
	return true;
}

static void test_dcp_strides(void)
{
	flx_ckpt *c = open_ok(DCP, NULL);
	size_t shared = 0, multi = 0, own = 0;

	for (size_t i = 0; c && i < c->ntensors; i++) {
		const flx_tensor *t = &c->tensors[i];

		multi += t->ndim > 0 && t->nchunks > 1;
		for (uint32_t k = 0; k < t->nchunks && t->ndim > 0; k++) {
			const flx_chunk *ch = &t->chunks[k], *prev = ch - 1;
			bool same = k > 0 && dense(t, prev);

			for (int d = 1; d < t->ndim; d++)
				same = same && ch->size[d] == prev->size[d];
			if (!dense(t, ch)) {
				/* saved transposed: its own, as read */
				CHECK(ch->contig_from > 0);
				CHECK(k == 0 || ch->stride != prev->stride);
				own++;
				continue;
			}
			CHECK_EQ(ch->contig_from, 0);
			if (same) {
				CHECK(ch->stride == prev->stride);
				shared++;
			}
		}
	}
	CHECK(multi > 0 && shared >= multi && own > 0);
	flx_ckpt_close(c);
}

static void test_detection(void)
{
	flx_ckpt_opts dcp = {.format = "torch-dcp"};
	flx_ckpt_opts hf = {.format = "hf-safetensors"};
	flx_ckpt_opts bad = {.format = "paddle"};
	char tmp[] = "/tmp/flx-index.XXXXXX";
	flx_ckpt *c;
	flx_error err;

	c = open_ok(HF, &hf);
	if (c)
		CHECK_STR(c->format, "hf-safetensors");
	flx_ckpt_close(c);
	CHECK_EQ(open_fails(HF, &dcp, &err), -ENOENT);
	CHECK(strstr(err.file, "/.metadata") != NULL);
	CHECK_EQ(open_fails(DCP, &hf, &err), -ENOENT);
	CHECK(strstr(err.file, "/model.safetensors") != NULL);
	CHECK_EQ(open_fails(DCP, &bad, &err), -EINVAL);
	CHECK(strstr(err.text, "unknown checkpoint format 'paddle'") != NULL);
	/* recognised by nobody: one line naming what each source wants */
	CHECK(mkdtemp(tmp) != NULL);
	CHECK_EQ(open_fails(tmp, NULL, &err), -ENOENT);
	CHECK(strstr(err.file, "/.metadata") != NULL);
	CHECK(strstr(err.text, "PyTorch DCP") != NULL);
	CHECK(strstr(err.text, "no model.safetensors[.index.json] (Hugging "
			       "Face safetensors)") != NULL);
	CHECK(strstr(err.text, "no metadata.json (Megatron-Core)") != NULL);
	CHECK(strstr(err.text, "no <id>.metadata (Paddle Flex Checkpoint)") !=
	      NULL);
	CHECK(strstr(err.text, "no rank_<N>/*.ckpt (MindSpore)") != NULL);
	CHECK_EQ(rmdir(tmp), 0);
}

/* Read all of path; NULL when it cannot. */
static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET) || !(buf = malloc((size_t)n + 1)) ||
	    fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		return NULL;
	}
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* The HF index against its files: the header parsed here, the bytes
 * against the truth.  @return the number of tensors checked. */
static size_t check_hf(const char *dir, const flx_ckpt *c)
{
	size_t checked = 0;

	CHECK_STR(c->format, "hf-safetensors");
	CHECK_STR(c->writer, "safetensors (format pt)");
	CHECK_EQ(c->nobjects, 0);
	CHECK(c->loading == NULL);
	for (size_t i = 0; i < c->nfiles; i++) {
		const flx_file *f = &c->files[i];
		bool extra = !strcmp(f->relpath, "config.json") ||
			     !strcmp(f->relpath, "tokenizer.json");

		CHECK_EQ(f->data, !extra);
	}
	for (size_t i = 0; i < c->ntensors; i++) {
		const flx_tensor *t = &c->tensors[i];
		const flx_chunk *ch = &t->chunks[0];
		const flx_file *f = &c->files[ch->file];
		char path[512];
		unsigned char *file, *truth;
		size_t flen = 0, tlen = 0;
		uint64_t n = 0, step = 1;
		json_t *h, *e;

		CHECK_EQ(t->nchunks, 1);
		snprintf(path, sizeof(path), "%s/%s", dir, f->relpath);
		file = slurp(path, &flen);
		snprintf(path, sizeof(path), "%s/%s.bin", HF_TRUTH, t->fqn);
		truth = slurp(path, &tlen);
		CHECK(file && truth && flen >= 8);
		if (!file || !truth || flen < 8) {
			free(file);
			free(truth);
			continue;
		}
		for (int b = 7; b >= 0; b--)
			n = n << 8 | file[b];
		h = json_loadb((const char *)file + 8, n, 0, NULL);
		e = json_object_get(h, t->fqn);
		CHECK(e != NULL);
		CHECK_EQ(ch->data_off,
			 8 + n +
			     json_integer_value(json_array_get(
				 json_object_get(e, "data_offsets"), 0)));
		for (int d = t->ndim - 1; d >= 0; d--) {
			CHECK_EQ(ch->off[d], 0);
			CHECK_EQ(ch->size[d], t->shape[d]);
			CHECK_EQ(ch->stride[d], (int64_t)step);
			step *= t->shape[d] ? (uint64_t)t->shape[d] : 1;
		}
		CHECK_EQ(ch->contig_from, 0);
		CHECK_EQ(ch->storage_offset, 0);
		CHECK(ch->data_off + tlen <= flen);
		if (ch->data_off + tlen <= flen)
			CHECK(memcmp(file + ch->data_off, truth, tlen) == 0);
		json_decref(h);
		free(file);
		free(truth);
		checked++;
	}
	return checked;
}

static void test_hf(void)
{
	flx_ckpt *one = open_ok(HF, NULL), *sh = NULL;
	flx_error err;
	size_t n1 = 0, n3 = 0;

	if (one)
		n1 = check_hf(HF, one);
	flx_error_init(&err);
	/* no items: the open is complete at once */
	CHECK_EQ(flx_ckpt_open_start(HF_SH, &sh, &err), 0);
	if (sh) {
		CHECK(sh->loading == NULL);
		CHECK_EQ(flx_ckpt_finish(sh, &err), 0);
		n3 = check_hf(HF_SH, sh);
		/* the same tensors, in shard then data order */
		for (size_t i = 0; one && i < sh->ntensors; i++)
			CHECK(flx_ckpt_find(one, sh->tensors[i].fqn) != NULL);
		for (size_t i = 0; i < sh->nfiles; i++)
			CHECK(sh->files[i].data ==
			      (strstr(sh->files[i].relpath, "-of-00003") !=
			       NULL));
	}
	CHECK_EQ(n1, 44);
	CHECK_EQ(n3, 44);
	flx_ckpt_close(one);
	flx_ckpt_close(sh);
}

/* The kernel's read check: owner bit, else group bit, else other bit. */
static bool may_read(const flx_access *a, uid_t uid, unsigned groups)
{
	if (uid == a->uid)
		return a->read & 0400;
	if (groups >> a->gid & 1)
		return a->read & 0040;
	return a->read & 0004;
}

/* Owners 0..2, groups 0..1, every read-bit set; users 0..3 in every set
 * of the two groups. */
static void test_access_meet(void)
{
	size_t checked = 0, exact = 0;

	for (unsigned k = 0; k < 3 * 2 * 8 * 3 * 2 * 8; k++) {
		unsigned x = k;
		flx_access a, b, m;

		a.uid = x % 3, x /= 3;
		a.gid = x % 2, x /= 2;
		a.read = (uint16_t)((x & 4 ? 0400 : 0) | (x & 2 ? 0040 : 0) |
				    (x & 1 ? 0004 : 0)),
		x /= 8;
		b.uid = x % 3, x /= 3;
		b.gid = x % 2, x /= 2;
		b.read = (uint16_t)((x & 4 ? 0400 : 0) | (x & 2 ? 0040 : 0) |
				    (x & 1 ? 0004 : 0));
		m = a;
		flx_access_meet(&m, &b);
		CHECK(m.uid == a.uid && m.gid == a.gid);
		for (uid_t u = 0; u < 4; u++)
			for (unsigned g = 0; g < 4; g++) {
				bool both =
				    may_read(&a, u, g) && may_read(&b, u, g);

				if (may_read(&m, u, g) && !both)
					CHECK(!"meet lets read what a source "
					       "refuses");
				if (a.uid == b.uid && a.gid == b.gid) {
					CHECK(may_read(&m, u, g) == both);
					exact++;
				}
				checked++;
			}
	}
	CHECK(checked == 2304 * 16 && exact > 0);
}

/* ---- the walks over a directory's top names ---- */

#define TOP_MAX 64

typedef struct top_seen {
	char name[TOP_MAX][NAME_MAX + 1];
	bool dir[TOP_MAX];
	int n, stop_at, rc_stop;
} top_seen;

static int top_add(void *arg, const char *name, bool dir)
{
	top_seen *t = arg;

	CHECK(t->n < TOP_MAX && strlen(name) <= NAME_MAX);
	if (t->n >= TOP_MAX || strlen(name) > NAME_MAX)
		return -1;
	snprintf(t->name[t->n], sizeof(t->name[0]), "%s", name);
	t->dir[t->n++] = dir;
	return t->n == t->stop_at ? t->rc_stop : 0;
}

static int top_add_dir(void *arg, const char *name)
{
	return top_add(arg, name, true);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *top_name_at(void *ctx, uint32_t i)
{
	const char *const *v = ctx;

	return v[i];
}

/* t's names as a set: sorted, and equal to want's (n of them). */
static void top_same(const top_seen *t, const top_seen *want)
{
	const char *a[TOP_MAX], *b[TOP_MAX];

	CHECK_EQ(t->n, want->n);
	if (t->n != want->n)
		return;
	for (int i = 0; i < t->n; i++) {
		a[i] = t->name[i];
		b[i] = want->name[i];
	}
	qsort(a, (size_t)t->n, sizeof(*a), cmp_str);
	qsort(b, (size_t)t->n, sizeof(*b), cmp_str);
	for (int i = 0; i < t->n; i++) {
		int ia = (int)((const char(*)[NAME_MAX + 1]) a[i] - t->name);
		int ib = (int)((const char(*)[NAME_MAX + 1]) b[i] - want->name);

		CHECK_STR(a[i], b[i]);
		CHECK_EQ(t->dir[ia], want->dir[ib]);
	}
}

static void test_top_names(void)
{
	/* names that sort around '/' ('-' and '.' before it), hidden ones,
	 * nested directories, a long directory name */
	static const char *const paths[] = {
	    "a-b/x",
	    "a.b",
	    "a/x",
	    "a/y/z",
	    "a/y/w",
	    "ab",
	    ".hidden/x",
	    ".dot",
	    "zz/1/2/3",
	    "zz/q",
	    "m",
	    "b/.h",
	    "long-directory-name-past-the-others/f",
	};
	const size_t np = sizeof(paths) / sizeof(paths[0]);
	const char *sorted[sizeof(paths) / sizeof(paths[0]) + 1];
	char root[] = "/tmp/flexfs-test-top-XXXXXX", p[PATH_MAX];
	top_seen want = {0}, got = {0};
	struct dirent *e;
	struct stat st;
	int dfd, n_dirs = 0, k;
	DIR *d;

	CHECK(mkdtemp(root) != NULL);
	for (size_t i = 0; i < np; i++) {
		/* every directory on the way, then the file */
		for (const char *sl = strchr(paths[i], '/'); sl;
		     sl = strchr(sl + 1, '/')) {
			snprintf(p, sizeof(p), "%s/%.*s", root,
				 (int)(sl - paths[i]), paths[i]);
			CHECK(!mkdir(p, 0755) || errno == EEXIST);
		}
		snprintf(p, sizeof(p), "%s/%s", root, paths[i]);
		k = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
		CHECK(k >= 0);
		if (k >= 0)
			close(k);
		sorted[i] = paths[i];
	}
	sorted[np] = NULL;
	qsort(sorted, np, sizeof(*sorted), cmp_str);
	dfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dfd >= 0);

	/* the oracle: what the kernel lists at the top, hidden ones left */
	d = opendir(root);
	CHECK(d != NULL);
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.') {
			CHECK(
			    !fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW));
			top_add(&want, e->d_name, S_ISDIR(st.st_mode));
			n_dirs += S_ISDIR(st.st_mode);
		}
	if (d)
		closedir(d);
	CHECK_EQ(want.n, 8);
	CHECK_EQ(n_dirs, 5);

	CHECK_EQ(flx_each_listed_name(top_name_at, sorted, NAME_MAX, UINT_MAX,
				      top_add, &got),
		 0);
	top_same(&got, &want);
	memset(&got, 0, sizeof(got));
	CHECK_EQ(flx_each_local_name(dfd, UINT_MAX, top_add, &got), 0);
	top_same(&got, &want);

	/* the subdirectories alone */
	memset(&got, 0, sizeof(got));
	CHECK_EQ(flx_each_listed_dir(top_name_at, sorted, NAME_MAX, UINT_MAX,
				     top_add_dir, &got),
		 0);
	CHECK_EQ(got.n, n_dirs);
	for (int i = 0; i < got.n; i++) {
		CHECK(!fstatat(dfd, got.name[i], &st, AT_SYMLINK_NOFOLLOW) &&
		      S_ISDIR(st.st_mode));
		for (int j = 0; j < i; j++)
			CHECK(strcmp(got.name[i], got.name[j]));
	}

	/* at most 2 subdirectories: the walk ends at the second, in the
	 * list's order (a-b, then a) */
	memset(&got, 0, sizeof(got));
	CHECK_EQ(flx_each_listed_name(top_name_at, sorted, NAME_MAX, 2, top_add,
				      &got),
		 0);
	CHECK_EQ(got.n, 3);
	CHECK(got.n == 3 && !strcmp(got.name[0], "a-b") && got.dir[0] &&
	      !strcmp(got.name[1], "a.b") && !got.dir[1] &&
	      !strcmp(got.name[2], "a") && got.dir[2]);

	/* a directory name longer than longest is passed over, nothing
	 * under it stands for a file at the top */
	memset(&got, 0, sizeof(got));
	k = (int)strlen("long-directory-name-past-the-others");
	CHECK_EQ(flx_each_listed_name(top_name_at, sorted, (size_t)k - 1,
				      UINT_MAX, top_add, &got),
		 0);
	CHECK_EQ(got.n, want.n - 1);
	for (int i = 0; i < got.n; i++)
		CHECK((int)strlen(got.name[i]) < k);
	memset(&got, 0, sizeof(got));
	CHECK_EQ(flx_each_listed_name(top_name_at, sorted, (size_t)k, UINT_MAX,
				      top_add, &got),
		 0);
	top_same(&got, &want);

	/* fn's nonzero ends the walk and is returned */
	memset(&got, 0, sizeof(got));
	got.stop_at = 3;
	got.rc_stop = 7;
	CHECK_EQ(flx_each_listed_name(top_name_at, sorted, NAME_MAX, UINT_MAX,
				      top_add, &got),
		 7);
	CHECK_EQ(got.n, 3);
	memset(&got, 0, sizeof(got));
	got.stop_at = 3;
	got.rc_stop = -EIO;
	CHECK_EQ(flx_each_local_name(dfd, UINT_MAX, top_add, &got), -EIO);
	CHECK_EQ(got.n, 3);

	/* at most max entries read, hidden ones counted */
	memset(&got, 0, sizeof(got));
	CHECK_EQ(flx_each_local_name(dfd, 0, top_add, &got), 0);
	CHECK_EQ(got.n, 0);
	CHECK_EQ(flx_each_local_name(-1, UINT_MAX, top_add, &got), -EBADF);

	for (size_t i = np; i-- > 0;) {
		const char *s = sorted[i];

		snprintf(p, sizeof(p), "%s/%s", root, s);
		CHECK(!unlink(p));
	}
	/* the directories, deepest first */
	{
		static const char *const dirs[] = {
		    "zz/1/2",  "zz/1", "zz",
		    "a/y",     "a",    "a-b",
		    ".hidden", "b",    "long-directory-name-past-the-others"};

		for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
			snprintf(p, sizeof(p), "%s/%s", root, dirs[i]);
			CHECK(!rmdir(p));
		}
	}
	if (dfd >= 0)
		close(dfd);
	CHECK(!rmdir(root));
}

int main(void)
{
	test_access_meet();
	test_dcp_threads();
	test_dcp_strides();
	test_detection();
	test_hf();
	test_top_names();
	return CHECK_RESULT();
}
