/* SPDX-License-Identifier: MIT */
/*
 * The passthrough decision (flx_fs_mark_whole(), tree.h): which files of a
 * tree are the whole of one backing file, byte for byte.  The oracle is
 * independent of the segments: a file's bytes, read through the tree,
 * compared with the whole of the backing file the decision names (read
 * from the directory by path).  Checkpoints: tests/fixtures/hf-tiny/single
 * (written by the safetensors library: its header is not flexfs's), a
 * copy of it whose model.safetensors is flexfs's own hf/ file (flexfs's
 * header: hf/ reproduces it), and that copy with one header byte moved
 * (same size, same data offsets, another header: never whole).
 */
#include "check.h"
#include "stack.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF "fixtures/hf-tiny/single"

static unsigned char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	unsigned char *b = NULL;
	long len;

	*n = 0;
	if (!f)
		return NULL;
	if (!fseek(f, 0, SEEK_END) && (len = ftell(f)) >= 0 &&
	    !fseek(f, 0, SEEK_SET) && (b = malloc((size_t)len + 1)) &&
	    fread(b, 1, (size_t)len, f) == (size_t)len)
		*n = (size_t)len;
	fclose(f);
	return b;
}

static void put(const char *path, const void *b, size_t n)
{
	FILE *f = fopen(path, "wb");

	CHECK(f != NULL);
	if (f) {
		CHECK_EQ(fwrite(b, 1, n, f), n);
		CHECK_EQ(fclose(f), 0);
	}
}

static int build(const char *dir, const char *tp, flx_spec *sp, flx_stack *st)
{
	flx_error err = {0};
	int rc;

	memset(st, 0, sizeof(*st));
	CHECK_EQ(flx_spec_init(sp), 0);
	CHECK_EQ(flx_spec_set(sp, "tp", tp, &err), 0);
	rc = flx_stack_build(dir, NULL, sp, false, st, &err);
	CHECK_EQ(rc, 0);
	if (rc)
		fprintf(stderr, "build %s: %s: %s: %s\n", dir, err.file,
			err.key, err.text);
	return rc;
}

/* The bytes of file path of fs (malloc'd, *n). */
static unsigned char *view_bytes(const flx_fs *fs, const char *path, size_t *n)
{
	flx_stat s;
	unsigned char *b;

	*n = 0;
	if (flx_fs_resolve(fs, path, &s) || s.dir)
		return NULL;
	b = malloc(s.size + 1);
	if (b && flx_fs_read(fs, s.ino, b, s.size, 0, NULL) == (ssize_t)s.size)
		*n = s.size;
	return b;
}

/*
 * Every file of the tree under dir: the decision never names a file
 * whose bytes differ from the whole of that backing file.  The files
 * named in want must be whole, those in unwanted must not.
 * @return how many files are whole.
 */
static size_t check_tree(const char *dir, const flx_stack *st,
			 const char *const *want, const char *const *unwanted)
{
	const flx_fs *fs = st->fs;
	const flx_ckpt *c = flx_stack_ckpt(st);
	size_t nwhole = 0;

	CHECK_EQ(flx_fs_mark_whole(st->fs), 0);
	for (flx_ino ino = 1; ino <= flx_fs_inode_count(fs); ino++) {
		char path[1024], bpath[2048];
		unsigned char *v, *b;
		size_t nv, nb;
		bool whole = true;
		uint32_t file = 0;
		flx_stat s;

		CHECK_EQ(flx_fs_stat(fs, ino, &s), 0);
		if (s.dir) {
			CHECK_EQ(flx_fs_whole_file(fs, ino, &whole, &file),
				 -EISDIR);
			continue;
		}
		CHECK_EQ(flx_fs_whole_file(fs, ino, &whole, &file), 0);
		CHECK_EQ(flx_fs_path(fs, ino, path, sizeof(path)), 0);
		for (size_t i = 0; want && want[i]; i++)
			if (!strcmp(want[i], path) && !whole)
				CHECK(!"a whole file was not found whole");
		for (size_t i = 0; unwanted && unwanted[i]; i++)
			if (!strcmp(unwanted[i], path) && whole)
				CHECK(!"a file was found whole that is not");
		if (!whole)
			continue;
		nwhole++;
		CHECK(file < c->nfiles);
		snprintf(bpath, sizeof(bpath), "%s/%s", dir,
			 c->files[file].relpath);
		v = view_bytes(fs, path, &nv);
		b = slurp(bpath, &nb);
		CHECK(v && b && nv == nb && nv > 0);
		if (v && b && nv == nb && memcmp(v, b, nv)) {
			fprintf(stderr, "%s: not %s byte for byte\n", path,
				bpath);
			CHECK(!"whole file differs from its backing file");
		}
		free(v);
		free(b);
	}
	return nwhole;
}

int main(void)
{
	char tmpl[] = "/tmp/flx-whole-XXXXXX", path[1024];
	const char *dir = mkdtemp(tmpl);
	static const char *const verbatim[] = {"hf/config.json",
					       "hf/tokenizer.json", NULL};
	static const char *const whole_hf[] = {"hf/model.safetensors",
					       "hf/config.json",
					       "hf/tokenizer.json", NULL};
	static const char *const never[] = {"index.json",
					    "hf/model.safetensors", NULL};
	static const char *const never_own[] = {
	    "index.json", "ranks/tp00_pp00/model.safetensors",
	    "ranks/tp01_pp00/model.safetensors", NULL};
	flx_spec sp;
	flx_stack st;
	unsigned char *m = NULL, *t;
	size_t nm = 0, nt;
	bool whole = true;
	uint32_t file;

	CHECK(dir != NULL);
	if (!dir)
		return CHECK_RESULT();

	/* the library's file: its verbatim files only */
	if (!build(HF, "1", &sp, &st)) {
		/* before the decision: nothing */
		flx_stat s;

		CHECK_EQ(flx_fs_resolve(st.fs, "hf/config.json", &s), 0);
		CHECK_EQ(flx_fs_whole_file(st.fs, s.ino, &whole, &file), 0);
		CHECK(!whole);
		CHECK_EQ(flx_fs_whole_file(st.fs, 0, &whole, &file), -ENOENT);
		CHECK_EQ(check_tree(HF, &st, verbatim, never), 2);
		m = view_bytes(st.fs, "hf/model.safetensors", &nm);
		CHECK(m && nm > 8);
	}
	flx_stack_free(&st);
	flx_spec_release(&sp);

	/* flexfs's own hf/ file as the checkpoint: hf/ reproduces it whole;
	 * the ranks of tp 2 are slices, never whole */
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	put(path, m, nm);
	t = slurp(HF "/config.json", &nt);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	put(path, t, nt);
	free(t);
	t = slurp(HF "/tokenizer.json", &nt);
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	put(path, t, nt);
	free(t);
	if (!build(dir, "2", &sp, &st))
		CHECK_EQ(check_tree(dir, &st, whole_hf, never_own), 3);
	flx_stack_free(&st);
	flx_spec_release(&sp);

	/* the same header with a space moved from its end to its start:
	 * same size, same data offsets, other bytes */
	if (m && nm > 16 && m[8] == '{') {
		uint64_t hl = 0;

		for (int i = 0; i < 8; i++)
			hl |= (uint64_t)m[i] << (8 * i);
		CHECK(hl + 8 <= nm && m[8 + hl - 1] == ' ');
		if (hl + 8 <= nm && m[8 + hl - 1] == ' ') {
			memmove(m + 10, m + 9, hl - 2);
			m[9] = ' ';
			snprintf(path, sizeof(path), "%s/model.safetensors",
				 dir);
			put(path, m, nm);
			if (!build(dir, "1", &sp, &st))
				CHECK_EQ(check_tree(dir, &st, verbatim, never),
					 2);
			flx_stack_free(&st);
			flx_spec_release(&sp);
		}
	}
	free(m);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	unlink(path);
	rmdir(dir);
	return CHECK_RESULT();
}
