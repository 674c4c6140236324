/* SPDX-License-Identifier: MIT */
/*
 * Paddle pickles; see pdparams.h.  Pieces, in file order:
 *
 *   head             PROTO 4, the dict, MARK
 *   before(k)        the end of tensor k - 1, the "master_weights" key and
 *                    dict when k is its first tensor, tensor k's key and
 *                    its array up to the length of its bytes
 *   (view k)         tensor k's bytes
 *   close            the end of the last tensor, the end of
 *                    "master_weights" (or all of it, empty), the name
 *                    table's key and dict (state dict form)
 *   table(k)         the name table's items, by batches
 *   end              SETITEMS, STOP
 */
#include "pdparams.h"

#include "pickle_internal.h"
#include "compat.h"

#include <errno.h>
#include <stdlib.h>

/* The arrays are numpy's (flx_dtype_info.npy): paddle.load and pickle
 * with numpy 1.24 or 2.x read them all.  docs/formats/paddle.md */
const flx_fmt_dtypes flx_pd_dtypes = {.name = "pdparams"};
#include <string.h>

/* the keys paddle.save adds */
#define PD_TABLE  "StructuredToParameterName@@"
#define PD_MASTER "master_weights"

/* A literal with NULs in it: its bytes but the terminating one. */
#define PD_RAW(w, lit) flx_jw_raw(w, lit, sizeof(lit) - 1)

/* A file (owned by the fs). */
typedef struct pd_file {
	const flx_pd_set *set;
	int tp;
} pd_file;

/* paddle.save pickles the dict as a state dict unless one of its values
 * is a dict holding a tensor (_is_state_dict). */
static bool tuples(const flx_pd_set *s)
{
	return s->n > s->ntop;
}

static const flx_view *pd_view(const pd_file *f, size_t k)
{
	return flx_placement_view(f->set->e[k].pl, f->set->stage, f->tp,
				  f->set->ntp);
}

/*
 * The start of entry k: its key, then (tuple form) builtins.tuple and its
 * name, then _reconstruct(ndarray, (0,), b'b') and its state up to the
 * length of its bytes, as numpy's ndarray.__reduce__ gives it:
 * (1, shape, dtype(code, False, True) with state
 * (3, byteorder, None, None, None, -1, -1, 0), False, <bytes>).
 */
static void pd_start(flx_jw *w, const pd_file *f, size_t k)
{
	const flx_pd_entry *e = &f->set->e[k];
	const flx_view *v = pd_view(f, k);
	const flx_tensor *t = flx_view_tensor(v);
	const char *npy = flx_dtype_get(t->dtype)->npy; /* "<f4", "|u1" */
	uint64_t shape[FLX_MAX_DIMS], nb = flx_view_bytes(v);

	for (int d = 0; d < t->ndim; d++)
		shape[d] = (uint64_t)flx_view_box(v)->size[d];
	flx_pk_str(w, e->key);
	if (tuples(f->set)) {
		flx_pk_global(w, "builtins", "tuple");
		flx_pk_str(w, e->name);
	}
	flx_pk_global(w, "numpy.core.multiarray", "_reconstruct");
	flx_pk_global(w, "numpy", "ndarray");
	PD_RAW(w, "K\x00\x85"
		  "C\x01"
		  "b\x87R(K\x01");
	flx_pk_ints(w, t->ndim, shape);
	flx_pk_global(w, "numpy", "dtype");
	flx_pk_str(w, npy + 1);
	PD_RAW(w, "\x89\x88\x87R(K\x03X\x01\x00\x00\x00");
	flx_jw_raw(w, npy, 1);
	PD_RAW(w, "NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89");
	if (nb < 0x100000000ull) {
		flx_jw_raw(w, "B", 1);
		flx_pk_le(w, nb, 4);
	} else {
		flx_jw_raw(w, "\x8e", 1);
		flx_pk_le(w, nb, 8);
	}
}

/* The end of an entry: the array's state tuple, BUILD; (tuple form) the
 * (name, array) pair, the arguments' tuple, REDUCE. */
static void pd_finish(flx_jw *w, const pd_file *f)
{
	flx_jw_raw(w, "tb", 2);
	if (tuples(f->set))
		flx_jw_raw(w, "\x86\x85R", 3);
}

static int pd_head(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	flx_jw w = flx_jw_window(dst, lo, hi);

	(void)arg;
	(void)idx;
	flx_jw_raw(&w, "\x80\x04}(", 4);
	return flx_jw_end(&w, len);
}

static int pd_before(const void *arg, uint32_t idx, unsigned char *dst,
		     uint64_t lo, uint64_t hi, uint64_t *len)
{
	const pd_file *f = arg;
	flx_jw w = flx_jw_window(dst, lo, hi);

	if (idx)
		pd_finish(&w, f);
	if (idx == f->set->ntop) { /* the first master weight */
		flx_pk_str(&w, PD_MASTER);
		flx_jw_raw(&w, "}(", 2);
	}
	pd_start(&w, f, idx);
	return flx_jw_end(&w, len);
}

static int pd_close(const void *arg, uint32_t idx, unsigned char *dst,
		    uint64_t lo, uint64_t hi, uint64_t *len)
{
	const pd_file *f = arg;
	const flx_pd_set *s = f->set;
	flx_jw w = flx_jw_window(dst, lo, hi);

	(void)idx;
	if (s->n)
		pd_finish(&w, f);
	if (tuples(s)) {
		flx_jw_raw(&w, "u", 1); /* the end of master_weights */
		return flx_jw_end(&w, len);
	}
	if (s->master) {
		flx_pk_str(&w, PD_MASTER);
		flx_jw_raw(&w, "}", 1);
	}
	flx_pk_str(&w, PD_TABLE);
	flx_jw_raw(&w, s->n ? "}(" : "}", s->n ? 2 : 1);
	return flx_jw_end(&w, len);
}

static int pd_table(const void *arg, uint32_t idx, unsigned char *dst,
		    uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_pd_set *s = ((const pd_file *)arg)->set;
	flx_jw w = flx_jw_window(dst, lo, hi);

	for (size_t k = idx; k < s->n && k < idx + FLX_GEN_BATCH; k++) {
		flx_pk_str(&w, s->e[k].key);
		flx_pk_str(&w, s->e[k].name);
	}
	return flx_jw_end(&w, len);
}

static int pd_end(const void *arg, uint32_t idx, unsigned char *dst,
		  uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_pd_set *s = ((const pd_file *)arg)->set;
	flx_jw w = flx_jw_window(dst, lo, hi);

	(void)idx;
	if (!tuples(s) && s->n)
		flx_jw_raw(&w, "u", 1); /* the end of the name table */
	flx_jw_raw(&w, "u.", 2);
	return flx_jw_end(&w, len);
}

static const flx_gen_ops pd_head_ops = {"paddle pickle head", pd_head};
static const flx_gen_ops pd_before_ops = {"paddle pickle tensor", pd_before};
static const flx_gen_ops pd_close_ops = {"paddle pickle close", pd_close};
static const flx_gen_ops pd_table_ops = {"paddle pickle name table", pd_table};
static const flx_gen_ops pd_end_ops = {"paddle pickle end", pd_end};

int flx_pd_set_new(flx_fs *fs, size_t n, flx_pd_set **out)
{
	flx_pd_set *s = flx_fs_alloc(fs, sizeof(*s) + n * sizeof(flx_pd_entry));

	if (!s)
		return -ENOMEM;
	*s = (flx_pd_set){.e = (flx_pd_entry *)(s + 1), .ntp = 1};
	*out = s;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys of e[0, n), with the reserved ones, sorted: two equal ones
 * next to each other. */
static int dict_check(const flx_pd_entry *e, size_t n, const char **bad)
{
	const char **k = malloc((n + 2) * sizeof(*k));

	if (!k)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		k[i] = e[i].key;
	k[n] = PD_TABLE;
	k[n + 1] = PD_MASTER;
	qsort(k, n + 2, sizeof(*k), cmp_str);
	for (size_t i = 1; i < n + 2; i++)
		if (!strcmp(k[i - 1], k[i])) {
			/* borrowed from the set, not this array */
			for (size_t j = 0; j < n; j++)
				if (!strcmp(e[j].key, k[i]))
					*bad = e[j].key;
			free(k);
			return -EEXIST;
		}
	free(k);
	return 0;
}

int flx_pd_check(const flx_pd_set *set, const char **bad)
{
	int rc;

	for (size_t k = 0; k < set->n; k++) {
		const flx_pd_entry *e = &set->e[k];

		if (!flx_pk_utf8_ok(e->key) || !flx_pk_utf8_ok(e->name)) {
			*bad = flx_pk_utf8_ok(e->key) ? e->name : e->key;
			return -EINVAL;
		}
	}
	rc = dict_check(set->e, set->ntop, bad);
	if (!rc)
		rc = dict_check(set->e + set->ntop, set->n - set->ntop, bad);
	return rc;
}

int flx_pd_add_file(flx_fs *fs, int dir, const char *name,
		    const flx_pd_set *set, int tp)
{
	pd_file *f = flx_fs_alloc(fs, sizeof(*f));
	int file, rc = -ENOMEM;

	if (!f)
		goto out;
	*f = (pd_file){.set = set, .tp = tp};
	rc = flx_fs_mkfile(fs, dir, name, &file);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pd_head_ops, f, 0);
	for (size_t k = 0; !rc && k < set->n; k++) {
		rc = flx_fs_add_gen(fs, file, &pd_before_ops, f, (uint32_t)k);
		if (!rc)
			rc = flx_fs_add_view(fs, file, pd_view(f, k), NULL);
	}
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pd_close_ops, f, 0);
	for (size_t k = 0; !rc && !tuples(set) && k < set->n;
	     k += FLX_GEN_BATCH)
		rc = flx_fs_add_gen(fs, file, &pd_table_ops, f, (uint32_t)k);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pd_end_ops, f, 0);
out:
	return rc;
}
