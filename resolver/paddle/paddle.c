/* SPDX-License-Identifier: MIT */
/*
 * The Paddle Flex Checkpoint source (source.h, docs/formats/paddle.md
 * sections 1-4): "{id}.metadata" (a pickle of Paddle's Metadata dataclass,
 * from paddle.distributed.flex_checkpoint.dcp.metadata or the older
 * paddle.distributed.checkpoint.metadata, interpreted by class name and
 * field name) and the "{rank}_{id}.distcp" files, each a pickled dict of
 * numpy arrays plus a "StructuredToParameterName@@" table.
 *
 * The metadata's per-chunk parts (the LocalTensorMetadata lists of
 * state_dict_metadata, the pairs of storage_metadata) are streamed out of the
 * pickle VM batch by batch (flx_pickle_load_sink()) into compact records,
 * the entries matched with their LTMs as they come, which load_sdm() and
 * load_storage() read instead of the tree; whatever the records cannot
 * stand for exactly is decoded again as a tree (see the streaming
 * section).  A .distcp file's arrays give their entries what the tensors
 * need of them once the file is read (settle_file()), and the tensors
 * give back the entries and LTMs they read as they are built
 * (spend_entries()): at a million chunks the index (chunks and dims) is
 * most of what a mount holds at any time after the metadata's decode.
 *
 * Each .distcp is decoded once at mount by the inert pickle VM through a
 * bounded window: an array's bytes (BINBYTES/SHORT_BINBYTES/BINBYTES8 under
 * _reconstruct + BUILD, BYTEARRAY8 under protocol 5's _frombuffer) are
 * recorded as offset + length, never copied, and become ordinary chunks
 * (file, data_off, strides) that the views read in place.
 *
 * A flattened shard (sharding stage 1 v2: elements [start, stop) of the
 * row-major flattening of the block local_shape at global_offset) becomes
 * up to 2N-1 box chunks: a partial run along the innermost axis, then runs
 * of whole rows, whole planes, ..., then partial ones again (flx_flat_boxes(),
 * shape.h). Each box's elements are consecutive in the 1-D payload with the
 * block's row-major strides, so the index, its coverage and overlap checks and
 * the read path see ordinary chunks.  The tensor's saved split axis is the one
 * its blocks differ along (flx_tensor.saved_split), since the boxes' offsets
 * differ along more.
 *
 * Protocol 2 writes bytes as _codecs.encode(str, 'latin1'): the file holds
 * the UTF-8 text of the latin-1 string, equal to the raw bytes only when
 * every byte is below 0x80.  Such an array is read in place; any other is
 * decoded once at mount into a memory file that the index serves like a
 * data file (decode_latin1(): bounded, refused in one line past
 * MAX_DECODED).
 *
 * Under protocols 2 and 3 Paddle saves a large array in pieces
 * (docs/formats/paddle.md#arrays-saved-in-pieces item 2:
 * "UnpackBigParamInfor@@" lists, per key, its OriginShape and the 1-D slices
 * whose concatenation is the array).  Each slice is read in place (or decoded,
 * as above) as a run of the block's row-major order, that is as box chunks like
 * a flattened shard's (nruns(), run_of()): a chunk is one strided byte range of
 * one file, and a flat cut seldom falls on a row boundary.  Every entry is
 * checked (read_pieces()).
 *
 * Replicas (replica_id > 0) are skipped; only the files storage_metadata
 * names for the primary copies are read.  A PaddleFormers checkpoint-N/
 * (no metadata of its own) is read as its model_state/, optimizer_state/
 * and master_weight/ directories, one after the other (load_part()).
 */
#include "grow.h"
#include "pickle.h"
#include "reader.h"
#include "paddle/paddle.h"
#include "source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_METADATA_BYTES (1ull << 30)
#define NAME_TABLE	   "StructuredToParameterName@@"
#define UNPACK_INFO	   "UnpackBigParamInfor@@"
#define MOD_FLEX	   "paddle.distributed.flex_checkpoint.dcp.metadata"
#define MOD_OLD		   "paddle.distributed.checkpoint.metadata"
#define MAX_BOXES	   FLX_FLAT_BOXES_MAX
#define MAX_DECODED	   (1ull << 30) /* protocol-2 arrays decoded at mount */
#define DECODE_BLOCK	   (64u * 1024)

/* One LocalTensorMetadata of state_dict_metadata. */
typedef struct ltm {
	/* off at L->dims[dims], shape at [dims + ndim], then, when flat, the
	 * flattened_range's start and stop (ltm_start(), ltm_stop()) */
	size_t dims;
	size_t gdims;	 /* global_shape at L->dims[gdims] (shared by the
			  * LTMs before it with the same one) */
	flx_dtype dtype; /* FLX_DT_INVALID: the metadata has none */
	int8_t ndim;
	int8_t gndim; /* -1: no global_shape */
	bool flat;
} ltm;

/* One key of state_dict_metadata: its LTMs [lo, lo + n) of L->ltms. */
typedef struct pkey {
	char *fqn; /* in the index's pool: the tensor's name */
	size_t lo, n;
	size_t hint; /* where in ltm_ord the next entry's LTM likely is */
	size_t nse;  /* storage entries (primary copies) naming it */
} pkey;

/* One array of a .distcp file (one per chunk: 56 bytes). */
typedef struct parr {
	const char *key; /* in the tree while the file is read, then pool */
	size_t sh;	 /* the shape: L->adims[sh, sh + ndim) */
	uint64_t off, len;
	union {
		/* an array saved in pieces (protocol 2/3, UNPACK_INFO): the
		 * concatenation of the 1-D slices [slice0, slice0 +
		 * nslices) of the file's slices, in order, with no bytes
		 * of its own (off, len 0); nslices 0 for any other array.
		 * A file's slices are values of its pickle: fewer than its
		 * max_nodes, and than 2^32 (decode_slice()). */
		struct {
			uint32_t slice0, nslices;
		};
		/* a slice (pfile.slices): the flat index of its first
		 * element */
		int64_t first;
	};
	flx_dtype dtype; /* the numpy dtype's (bf16 shows as U16) */
	uint32_t rank;	 /* the key's place in name order (L->krank) */
	/* the storage entry (index + 1) the array is the shard of; 0: none
	 * yet (a file holds one array per key,
	 * docs/formats/paddle.md#metadata-semantics); entries are fewer
	 * than 2^32 (load_files()) */
	uint32_t taken;
	int8_t ndim;
	bool fortran;
	/* protocol 2's _codecs.encode(str, 'latin1') with bytes >= 0x80:
	 * off, len first give the UTF-8 text in the file, then (decoded)
	 * the bytes in the loader's memory file */
	bool latin1;
} parr;

typedef struct pfile {
	const char *relpath;
	const char *name; /* as storage_metadata gives it (relpath without
			   * the part's prefix) */
	uint32_t idx;	  /* into c->files */
	parr *arr;	  /* sorted by key */
	size_t narr;
	parr *slices; /* of the arrays saved in pieces, each list in order */
	size_t nslices, capslices;
	bool settled; /* its arrays' fields are its entries' (settle_file()) */
} pfile;

/* One storage_metadata entry with replica_id 0 or None (one per chunk:
 * 40 bytes). */
typedef struct sent {
	uint32_t key; /* into L->keys */
	/* into L->files (efile()); until load_files(), the interned file
	 * name's index (L->istr): the value, a file name */
	uint32_t pf;
	uint32_t ltm; /* into L->ltms (fewer than 2^32, resolve_entry()) */
	/* What the tensors need of its array in that file (its parr's
	 * fields, set by load_files(), which then frees the files'
	 * arrays); the shape at L->adims[sh, sh + ndim) unless sok */
	uint32_t sh;
	uint64_t off;
	uint32_t slice0, nslices;
	flx_dtype dtype;
	int8_t ndim;
	bool fortran, latin1;
	bool sok; /* the array holds its LTM's shard (holds_shard()) */
} sent;

/* One storage_metadata entry as its LocalTensorIndex and value give it
 * (parse_entry()), before it is matched with state_dict_metadata. */
typedef struct lti {
	const char *key, *file;
	int na, ns; /* ns -1: no local_shape */
	bool flat;
	int64_t start, stop, rep;
	int64_t off[FLX_MAX_DIMS], shape[FLX_MAX_DIMS];
} lti;

/* A primary storage entry streamed (se_sink()): its strings interned
 * (L->istr), its offsets then local_shape at L->rdims[dims] (16 bytes;
 * past 2^32 - 1 dims the stream declines). */
typedef struct rawse {
	uint32_t key, file;
	uint32_t dims; /* then, when flat, the flattened range's start, stop */
	int8_t na, ns;
	bool flat;
} rawse;

/* A primary storage entry resolved while it streamed (se_sink(), placed):
 * what sent holds before load_files() (8 bytes; its key is the one whose
 * LTMs hold ltm, expand_placed()). */
typedef struct pent {
	uint32_t pf, ltm;
} pent;

/* A state_dict_metadata list streamed (ltm_sink()): its LTMs
 * [lo, lo + n) of L->ltms. */
typedef struct sgroup {
	const flx_pv *list;
	size_t lo, n;
} sgroup;

typedef struct loader {
	flx_build *b;
	flx_ckpt *c;
	flx_error *err;
	uint64_t id;
	const char *prefix; /* "" or a PaddleFormers part: "model_state/" */
	char meta[64];	    /* prefix + "{id}.metadata" */
	const char *module;
	int64_t *dims;
	size_t ndims, capdims;
	bool dims_kept; /* dims is the index's (boxes_in_place()) */
	int64_t *adims; /* the shapes of the .distcp arrays (parr.sh) */
	size_t nadims, capadims;
	size_t adtotal; /* dims the part's arrays had (set_ashape()) */
	/* the shapes the tensors need, kept as each file is settled
	 * (settle_file()); adims once every file is */
	int64_t *kept;
	size_t nkept, capkept;
	/* ltm_map: L->ltms is mapped pages of their own, that many bytes
	 * (map_ltms()), or 0: malloc'd */
	ltm *ltms;
	size_t nltms, capltms, ltm_map;
	pkey *keys;
	size_t nkeys;
	uint32_t *by_name; /* key indices sorted by fqn */
	uint32_t *krank;   /* per key: its place in by_name */
	uint32_t *khash;   /* key index + 1 by str_hash(fqn), 0: free */
	size_t kmask;
	/* LTM indices: within each key's [lo, lo + n), sorted by (ndim,
	 * global_offset, index), so that a storage entry finds its LTM by
	 * binary search (a key has one LTM per rank) */
	size_t *ltm_ord;
	/* se_map: L->se is mapped pages of their own, that many bytes
	 * (expand_placed(); build_tensors() gives them back as it goes),
	 * or 0: malloc'd */
	sent *se;
	size_t nse, capse, se_map;
	pfile *files;
	size_t nfiles, capfiles;
	flx_name_pair *names;
	size_t nnames, capnames;
	/* the decoded protocol-2 arrays: a memfd (-1 until needed) of
	 * memlen bytes, then its file index */
	int memfd;
	uint64_t memlen;
	uint64_t memdone; /* bytes decoded into the memfds of earlier parts */
	uint32_t memfile;
	/* per key of the part: the name the .distcp files' name tables give
	 * it, then the first other name one gives it (add_names()) */
	const char **kname;
	size_t t0; /* the part's first tensor in c->tensors */
	/* the metadata's per-chunk parts streamed (load_metadata()): the
	 * lists of state_dict_metadata (sg, their LTMs in L->ltms, in stream
	 * order; usedsg: taken by load_sdm()), and the primary entries of
	 * storage_metadata (raw, when streamed) */
	sgroup *sg;
	size_t nsg, capsg, usedsg;
	bool streamed;
	rawse *raw;
	size_t nraw, capraw;
	int64_t *rdims;
	size_t nrdims, caprdims;
	/* the strings of the streamed entries, interned: istr[i] (in spool),
	 * found through the hash table itab (index + 1, 0: free) */
	flx_pool spool;
	const char **istr;
	size_t nistr, capistr;
	uint32_t *itab;
	size_t imask;
	long
	    *kmap; /* per interned string: its key index, -1 none, -2 unknown */
	size_t nkmap, capkmap;
	/* the first attempt: the entries resolved as they stream (pe), the
	 * keys made from the watched pairs of state_dict_metadata (nwk of
	 * them, key i's list L->sg[i]); se_on: an entry streamed, after
	 * which neither a pair nor an LTM may come */
	bool place, se_on;
	size_t nwk, capkeys;
	pent *pe;
	size_t npe, cappe;
} loader;

/* The DCP directories of a PaddleFormers "flex_checkpoint" save
 * (checkpoint-N/, docs/formats/paddle.md#checkpoint-files), in the order their
 * tensors are listed; ema_state/ has no metadata and is not one. */
static const char *const formers_parts[] = {"model_state", "optimizer_state",
					    "master_weight"};
#define NPARTS (sizeof(formers_parts) / sizeof(formers_parts[0]))

/* ---- file names ---- */

/* A decimal number without sign or leading zero (but "0") at s[0..n):
 * true and *v. */
static bool parse_id(const char *s, size_t n, uint64_t *v)
{
	uint64_t x = 0;

	if (n == 0 || n > 19 || (s[0] == '0' && n > 1))
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		x = x * 10 + (uint64_t)(s[i] - '0');
	}
	*v = x;
	return true;
}

/* "{id}.metadata": true and *id. */
static bool is_metadata_name(const char *name, uint64_t *id)
{
	size_t n = strlen(name);

	return n > 9 && strcmp(name + n - 9, ".metadata") == 0 &&
	       parse_id(name, n - 9, id);
}

/* "{rank}_{id}.distcp": true and *id. */
static bool is_distcp_name(const char *name, uint64_t *id)
{
	size_t n = strlen(name);
	const char *us = strchr(name, '_');
	uint64_t rank;

	return n > 7 && strcmp(name + n - 7, ".distcp") == 0 && us &&
	       parse_id(name, (size_t)(us - name), &rank) &&
	       parse_id(us + 1, (size_t)(name + n - 7 - (us + 1)), id);
}

static bool owns(const char *name)
{
	size_t n = strlen(name);
	uint64_t id;

	if (n > 14 && strcmp(name + n - 5, ".lock") == 0) {
		char base[256];

		if (n - 5 >= sizeof(base))
			return false;
		memcpy(base, name, n - 5);
		base[n - 5] = '\0';
		return is_metadata_name(base, &id);
	}
	return is_metadata_name(name, &id) || is_distcp_name(name, &id);
}

/* Walk the directory's entries: the highest id of the .distcp files
 * (Paddle's get_max_id) and of the .metadata files, and whether id want
 * has a .metadata. */
typedef struct ids {
	bool any_meta, any_data, has_want;
	uint64_t max_meta, max_data;
} ids;

static void note_id(ids *out, const char *name, uint64_t want)
{
	uint64_t id;

	if (is_metadata_name(name, &id)) {
		if (!out->any_meta || id > out->max_meta)
			out->max_meta = id;
		out->any_meta = true;
		if (id == want)
			out->has_want = true;
	} else if (is_distcp_name(name, &id)) {
		if (!out->any_data || id > out->max_data)
			out->max_data = id;
		out->any_data = true;
	}
}

static int scan_ids(int dirfd, uint64_t want, ids *out)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *e;

	memset(out, 0, sizeof(*out));
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	while ((e = readdir(d)))
		note_id(out, e->d_name, want);
	closedir(d);
	return 0;
}

/* Add to *out the files of the part prefix ("" or "model_state/") that
 * other nodes hold (-o mpi: flx_build_remote_name()), so that every node
 * picks the same id whatever it holds itself. */
static void scan_remote(const flx_build *b, const char *prefix, uint64_t want,
			ids *out)
{
	size_t pl = strlen(prefix);
	const char *n;

	for (uint32_t i = 0; (n = flx_build_remote_name(b, i)); i++)
		if (!strncmp(n, prefix, pl) && !strchr(n + pl, '/'))
			note_id(out, n + pl, want);
}

/* The subdirectory name of dirfd (no symlink), or -1 with errno. */
static int open_part(int dirfd, const char *name)
{
	return openat(dirfd, name,
		      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* Whether another node (-o mpi) holds files of the part directory name. */
static bool remote_part(const flx_build *b, const char *name)
{
	size_t n = strlen(name);
	const char *r;

	for (uint32_t i = 0; (r = flx_build_remote_name(b, i)); i++)
		if (!strncmp(r, name, n) && r[n] == '/')
			return true;
	return false;
}

/* A directory with a "{id}.metadata", or a PaddleFormers checkpoint-N/
 * whose model_state/ has one. */
static int probe(int dirfd, bool *yes)
{
	ids s;
	int rc = scan_ids(dirfd, 0, &s), sub;

	*yes = !rc && s.any_meta;
	if (rc || *yes)
		return rc;
	sub = open_part(dirfd, formers_parts[0]);
	if (sub < 0)
		return 0;
	rc = scan_ids(sub, 0, &s);
	close(sub);
	*yes = !rc && s.any_meta;
	return rc;
}

/* The id to read: the user's, else the highest .distcp id (Paddle's
 * get_max_id), else the highest .metadata id. */
static int pick_id(loader *L, const flx_ckpt_opts *o)
{
	int dirfd = flx_build_dirfd(L->b), rc;
	char part[64];
	uint64_t want = 0;
	bool has_want = !flx_opt_u64(o->vals, "paddle_id", &want);
	ids s;

	if (*L->prefix) {
		snprintf(part, sizeof(part), "%.*s", (int)strlen(L->prefix) - 1,
			 L->prefix);
		dirfd = open_part(dirfd, part);
		if (dirfd < 0 && !(errno == ENOENT && remote_part(L->b, part)))
			return flx_error_set(L->err, -errno, part, NULL,
					     "cannot open the directory: %s",
					     strerror(errno));
	}
	/* a part only other nodes hold (-o mpi) has no local entries */
	rc = dirfd < 0 ? 0 : scan_ids(dirfd, want, &s);
	if (dirfd < 0)
		memset(&s, 0, sizeof(s));
	if (*L->prefix && dirfd >= 0)
		close(dirfd);
	if (!rc)
		scan_remote(L->b, L->prefix, want, &s);

	if (rc)
		return flx_error_set(L->err, rc, NULL, NULL,
				     "cannot list the directory: %s",
				     strerror(-rc));
	if (has_want)
		L->id = want;
	else
		L->id = s.any_data ? s.max_data : s.max_meta;
	snprintf(L->meta, sizeof(L->meta), "%s%" PRIu64 ".metadata", L->prefix,
		 L->id);
	if (has_want && !s.has_want)
		return flx_error_set(L->err, -ENOENT, L->meta, "paddle_id",
				     "no such file (the highest id here is "
				     "%" PRIu64 ")",
				     s.any_data ? s.max_data : s.max_meta);
	return 0;
}

/* ---- interpretation helpers ---- */

/* A string without NUL bytes, or NULL. */
static const char *cstr(const flx_pv *v)
{
	const char *s = flx_pv_str(v);

	return s && strlen(s) == v->u.str.len ? s : NULL;
}

/* Whether v is an instance of Paddle's metadata class name, from either
 * module. */
static bool is_paddle_obj(const flx_pv *v, const char *name)
{
	const flx_pv *cls = flx_pv_obj_class(v);

	return cls && strcmp(cls->u.global.name, name) == 0 &&
	       (strcmp(cls->u.global.module, MOD_FLEX) == 0 ||
		strcmp(cls->u.global.module, MOD_OLD) == 0);
}

/* A dataclass's fields: the BUILD state dict, or (dict, slots dict) of a
 * slots dataclass (the slots part is used when the first is None). */
static const flx_pv *fields(const flx_pv *obj)
{
	const flx_pv *st =
	    obj && obj->kind == FLX_PV_OBJ ? obj->u.obj.state : NULL;

	if (st && st->kind == FLX_PV_TUPLE && flx_pv_len(st) == 2) {
		const flx_pv *a = flx_pv_item(st, 0);

		st = a && a->kind == FLX_PV_DICT ? a : flx_pv_item(st, 1);
	}
	return st && st->kind == FLX_PV_DICT ? st : NULL;
}

static const flx_pv *field(const flx_pv *obj, const char *name)
{
	return flx_pv_dict_get(fields(obj), name);
}

static bool is_none(const flx_pv *v)
{
	return !v || v->kind == FLX_PV_NONE;
}

/* A tuple or list of n <= FLX_MAX_DIMS non-negative ints. */
static int dims_of(loader *L, const char *file, const char *key,
		   const char *what, const flx_pv *v, int *n, int64_t *out)
{
	size_t k;

	if (!v || (v->kind != FLX_PV_TUPLE && v->kind != FLX_PV_LIST))
		return flx_error_set(L->err, -EINVAL, file, key,
				     "%s: expected a tuple of integers, found "
				     "%s",
				     what, v ? flx_pv_kind_name(v) : "nothing");
	k = flx_pv_len(v);
	if (k > FLX_MAX_DIMS)
		return flx_error_set(L->err, -EINVAL, file, key,
				     "%s: %zu dimensions (at most %d)", what, k,
				     FLX_MAX_DIMS);
	for (size_t i = 0; i < k; i++) {
		if (!flx_pv_int(flx_pv_item(v, i), &out[i]) || out[i] < 0)
			return flx_error_set(L->err, -EINVAL, file, key,
					     "%s: item %zu is not a "
					     "non-negative integer",
					     what, i);
		if (out[i] > (INT64_C(1) << 62))
			return flx_error_set(L->err, -EFBIG, file, key,
					     "%s: item %zu is %lld, past 2^62 "
					     "(the largest extent or offset "
					     "taken)",
					     what, i, (long long)out[i]);
	}
	*n = (int)k;
	return 0;
}

/* Append v[0..n) to the array *a (*len used, *cap room): its place in
 * *at.  @return 0 or -ENOMEM. */
static int push_i64(int64_t **a, size_t *len, size_t *cap, int n,
		    const int64_t *v, size_t *at)
{
	if (flx_grow((void **)a, cap, *len + (size_t)n + 1, sizeof(int64_t)))
		return -ENOMEM;
	*at = *len;
	if (n)
		memcpy(*a + *len, v, sizeof(int64_t) * (size_t)n);
	*len += (size_t)n;
	return 0;
}

static int push_dims(loader *L, int n, const int64_t *v, size_t *at)
{
	return push_i64(&L->dims, &L->ndims, &L->capdims, n, v, at);
}

/* An array's shape (valid until the next array is decoded). */
static const int64_t *ashape(const loader *L, const parr *a)
{
	return L->adims + a->sh;
}

/* shape[0..n) as the shape of array a. */
static int set_ashape(loader *L, const char *file, const char *key, parr *a,
		      int n, const int64_t *shape)
{
	/* an entry names its array's shape in 32 bits (sent.sh) */
	if (L->adtotal > UINT32_MAX - (size_t)n)
		return flx_error_set(L->err, -EOVERFLOW, file, key,
				     "more than 2^32 - 1 array dimensions in "
				     "the .distcp files");
	if (flx_grow((void **)&L->adims, &L->capadims,
		     L->nadims + (size_t)n + 1, sizeof(int64_t)))
		return -ENOMEM;
	a->ndim = (int8_t)n;
	a->sh = L->nadims;
	if (n)
		memcpy(L->adims + L->nadims, shape,
		       sizeof(int64_t) * (size_t)n);
	L->nadims += (size_t)n;
	L->adtotal += (size_t)n;
	return 0;
}

/* A flattened_range: a pair of ints (start, stop), 0 <= start <= stop. */
static int range_of(loader *L, const char *key, const flx_pv *v, int64_t *start,
		    int64_t *stop)
{
	int64_t r[FLX_MAX_DIMS];
	int n = 0, rc = dims_of(L, L->meta, key, "flattened_range", v, &n, r);

	if (rc)
		return rc;
	if (n != 2 || r[0] > r[1])
		return flx_error_set(L->err, -EINVAL, L->meta, key,
				     "flattened_range is not a pair "
				     "(start, stop) with start <= stop");
	*start = r[0];
	*stop = r[1];
	return 0;
}

/* A bool field that may be absent (default false). */
static int flag_of(loader *L, const char *key, const flx_pv *obj,
		   const char *name, bool *out)
{
	const flx_pv *v = field(obj, name);

	*out = false;
	if (is_none(v))
		return 0;
	if (v->kind != FLX_PV_BOOL && v->kind != FLX_PV_INT)
		return flx_error_set(L->err, -EINVAL, L->meta, key,
				     "%s is not a bool", name);
	*out = v->kind == FLX_PV_BOOL ? v->u.b : v->u.i != 0;
	return 0;
}

static char *pool_str(flx_pool *p, const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = flx_pool_alloc(p, n);

	if (d)
		memcpy(d, s, n);
	return d;
}

/* ---- state_dict_metadata ---- */

/* LTM v of key into *m; its dims appended to L->dims: the global shape
 * (when it differs from the LTM before's), then global_offset and
 * local_shape, so that a key's LTMs lie a fixed step apart (chunk boxes
 * read in place, build_tensor()). */
static int decode_ltm(loader *L, const char *key, const flx_pv *v, ltm *m)
{
	int64_t a[FLX_MAX_DIMS], s[FLX_MAX_DIMS], g[FLX_MAX_DIMS];
	const flx_pv *dt, *gs;
	int na, ns, ng = -1, rc;

	if (!is_paddle_obj(v, "LocalTensorMetadata") || !fields(v))
		return flx_error_set(L->err, -EINVAL, L->meta, key,
				     "state_dict_metadata entry is not a "
				     "Paddle LocalTensorMetadata");
	rc = dims_of(L, L->meta, key, "global_offset",
		     field(v, "global_offset"), &na, a);
	if (!rc)
		rc = dims_of(L, L->meta, key, "local_shape",
			     field(v, "local_shape"), &ns, s);
	if (rc)
		return rc;
	if (na != ns)
		return flx_error_set(L->err, -EINVAL, L->meta, key,
				     "global_offset has %d dimensions, "
				     "local_shape %d",
				     na, ns);
	m->ndim = (int8_t)na;
	dt = field(v, "dtype");
	m->dtype = FLX_DT_INVALID;
	if (!is_none(dt)) {
		m->dtype = flx_dtype_from_torch(cstr(dt));
		if (m->dtype == FLX_DT_INVALID)
			return flx_error_set(L->err, -EINVAL, L->meta, key,
					     "unsupported dtype '%s'",
					     cstr(dt) ? cstr(dt) : "?");
	}
	gs = field(v, "global_shape");
	m->gndim = -1;
	if (!is_none(gs)) {
		const ltm *p = m > L->ltms ? m - 1 : NULL;

		if ((rc = dims_of(L, L->meta, key, "global_shape", gs, &ng, g)))
			return rc;
		m->gndim = (int8_t)ng;
		/* a key's LTMs have one global shape: kept once */
		if (p && p->gndim == ng &&
		    !memcmp(L->dims + p->gdims, g,
			    sizeof(int64_t) * (size_t)ng))
			m->gdims = p->gdims;
		else if ((rc = push_dims(L, ng, g, &m->gdims)))
			return rc;
	}
	if ((rc = push_dims(L, na, a, &m->dims)) ||
	    (rc = push_dims(L, ns, s, &(size_t){0})))
		return rc;
	if ((rc = flag_of(L, key, v, "is_flattened", &m->flat)))
		return rc;
	if (m->flat) {
		int64_t r[2];

		if ((rc = range_of(L, key, field(v, "flattened_range"), &r[0],
				   &r[1])))
			return rc;
		return push_dims(L, 2, r, &(size_t){0});
	}
	return 0;
}

/* The flattened_range of a flat LTM m (0 for another). */
static int64_t ltm_start(const loader *L, const ltm *m)
{
	return m->flat ? L->dims[m->dims + 2 * (size_t)m->ndim] : 0;
}

static int64_t ltm_stop(const loader *L, const ltm *m)
{
	return m->flat ? L->dims[m->dims + 2 * (size_t)m->ndim + 1] : 0;
}

static uint64_t str_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

/* L->khash: the keys by the hash of their fqn (find_key()). */
static int hash_keys(loader *L)
{
	size_t m = 1;

	while (m < 2 * L->nkeys)
		m <<= 1;
	L->khash = calloc(m, sizeof(*L->khash));
	if (!L->khash)
		return -ENOMEM;
	L->kmask = m - 1;
	for (size_t i = 0; i < L->nkeys; i++) {
		size_t j = str_hash(L->keys[i].fqn) & L->kmask;

		while (L->khash[j])
			j = (j + 1) & L->kmask;
		L->khash[j] = (uint32_t)i + 1;
	}
	return 0;
}

static int cmp_key(const void *a, const void *b, void *arg)
{
	const loader *L = arg;

	return strcmp(L->keys[*(const uint32_t *)a].fqn,
		      L->keys[*(const uint32_t *)b].fqn);
}

static int load_sdm(loader *L, const flx_pv *sdm)
{
	size_t n;

	if (!sdm || sdm->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, L->meta,
				     "state_dict_metadata",
				     "missing or not a dict");
	n = sdm->u.dict.n;
	if (n > UINT32_MAX / 2)
		return flx_error_set(L->err, -EOVERFLOW, L->meta,
				     "state_dict_metadata", "%zu keys", n);
	/* placed: the keys the watched pairs made, the same n
	 * (stream_placed()), their entries counted */
	if (!L->keys)
		L->keys = calloc(n ? n : 1, sizeof(*L->keys));
	L->by_name = malloc((n ? n : 1) * sizeof(*L->by_name));
	L->kname = calloc(2 * (n ? n : 1), sizeof(*L->kname));
	if (!L->keys || !L->by_name || !L->kname)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *key = cstr(sdm->u.dict.kv[2 * i]);
		const flx_pv *list = sdm->u.dict.kv[2 * i + 1];
		pkey *k = &L->keys[i];

		if (!key)
			return flx_error_set(L->err, -EINVAL, L->meta,
					     "state_dict_metadata",
					     "key %zu is not a string without "
					     "NUL bytes",
					     i);
		if (!list ||
		    (list->kind != FLX_PV_LIST && list->kind != FLX_PV_TUPLE))
			return flx_error_set(L->err, -EINVAL, L->meta, key,
					     "state_dict_metadata value is not "
					     "a list");
		/* the tree is freed before the files are read */
		if (!(k->fqn = pool_str(&L->c->pool, key)))
			return -ENOMEM;
		L->by_name[i] = (uint32_t)i;
		if (flx_pv_streamed(list)) {
			/* its LTMs came from the stream (stream_placed()) */
			k->lo = L->sg[L->usedsg].lo;
			k->n = L->sg[L->usedsg++].n;
			continue;
		}
		k->lo = L->nltms;
		k->n = flx_pv_len(list);
		if (flx_grow((void **)&L->ltms, &L->capltms, L->nltms + k->n,
			     sizeof(ltm)))
			return -ENOMEM;
		for (size_t j = 0; j < k->n; j++) {
			int rc = decode_ltm(L, key, flx_pv_item(list, j),
					    &L->ltms[L->nltms + j]);

			if (rc)
				return rc;
		}
		L->nltms += k->n;
	}
	L->nkeys = n;
	qsort_r(L->by_name, n, sizeof(*L->by_name), cmp_key, L);
	for (size_t i = 1; i < n; i++)
		if (!strcmp(L->keys[L->by_name[i]].fqn,
			    L->keys[L->by_name[i - 1]].fqn))
			return flx_error_set(
			    L->err, -EINVAL, L->meta,
			    L->keys[L->by_name[i]].fqn,
			    "listed twice in state_dict_metadata");
	if (!(L->krank = malloc((n ? n : 1) * sizeof(*L->krank))))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		L->krank[L->by_name[i]] = (uint32_t)i;
	return hash_keys(L);
}

/* The index of key fqn in L->keys, or -1. */
static long find_key(const loader *L, const char *fqn)
{
	for (size_t j = str_hash(fqn) & L->kmask; L->khash[j];
	     j = (j + 1) & L->kmask)
		if (!strcmp(L->keys[L->khash[j] - 1].fqn, fqn))
			return (long)L->khash[j] - 1;
	return -1;
}

/* ---- storage_metadata ---- */

/* LTM j against (na, off): <0, 0, >0 as (ndim, global_offset) orders. */
static int cmp_ltm_off(const loader *L, size_t j, int na, const int64_t *off)
{
	const ltm *m = &L->ltms[j];
	const int64_t *mo = L->dims + m->dims;

	if (m->ndim != na)
		return m->ndim < na ? -1 : 1;
	for (int d = 0; d < na; d++)
		if (mo[d] != off[d])
			return mo[d] < off[d] ? -1 : 1;
	return 0;
}

static int cmp_ltm_ord(const void *a, const void *b, void *arg)
{
	const loader *L = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	const ltm *q = &L->ltms[y];
	int c = cmp_ltm_off(L, x, q->ndim, L->dims + q->dims);

	return c ? c : (x > y) - (x < y);
}

/* Give back what the LTMs' arrays hold beyond their length. */
static void fit(void **arr, size_t *cap, size_t n, size_t elem)
{
	void *p = n && n < *cap ? realloc(*arr, n * elem) : NULL;

	if (p) {
		*arr = p;
		*cap = n;
	}
}

/* Free the loader's array *arr (a T **) and forget it (NULL). */
static void drop(void *arr)
{
	void **a = arr;

	free(*a);
	*a = NULL;
}

/* drop() of an array that lies in pages of its own when *map (their
 * length) is not 0. */
static void drop_mapped(void *arr, size_t *map)
{
	void **a = arr;

	if (*map)
		munmap(*a, *map);
	else
		free(*a);
	*a = NULL;
	*map = 0;
}

/* After the entries found their LTMs: the order is not needed. */
static int drop_ltm_ord(loader *L)
{
	drop(&L->ltm_ord);
	return 0;
}

/* L->ltm_ord for the keys load_sdm read. */
static int sort_ltms(loader *L)
{
	fit((void **)&L->ltms, &L->capltms, L->nltms, sizeof(ltm));
	fit((void **)&L->dims, &L->capdims, L->ndims, sizeof(int64_t));
	L->ltm_ord = malloc((L->nltms ? L->nltms : 1) * sizeof(*L->ltm_ord));
	if (!L->ltm_ord)
		return -ENOMEM;
	for (size_t j = 0; j < L->nltms; j++)
		L->ltm_ord[j] = j;
	for (size_t i = 0; i < L->nkeys; i++)
		qsort_r(L->ltm_ord + L->keys[i].lo, L->keys[i].n,
			sizeof(*L->ltm_ord), cmp_ltm_ord, L);
	return 0;
}

/* The LTM of key k that a LocalTensorIndex names: the same global_offset,
 * flattened range and, when the index has one, local_shape
 * (docs/formats/paddle.md#metadata-semantics); the first in the metadata's
 * order when several are. */
static long match_ltm(const loader *L, pkey *k, int na, const int64_t *off,
		      bool flat, int64_t start, int64_t stop, int ns,
		      const int64_t *shape)
{
	size_t lo = k->lo, hi = k->lo + k->n, h = k->hint;

	/* entries listed in the LTMs' order find theirs at once */
	if (h > lo && h < hi && !cmp_ltm_off(L, L->ltm_ord[h], na, off) &&
	    cmp_ltm_off(L, L->ltm_ord[h - 1], na, off) < 0)
		lo = hi = h;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (cmp_ltm_off(L, L->ltm_ord[mid], na, off) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo;
	     i < k->lo + k->n && !cmp_ltm_off(L, L->ltm_ord[i], na, off); i++) {
		size_t j = L->ltm_ord[i];
		const ltm *m = &L->ltms[j];
		const int64_t *mo = L->dims + m->dims;

		if (m->flat != flat || (flat && (ltm_start(L, m) != start ||
						 ltm_stop(L, m) != stop)))
			continue;
		if (ns >= 0 && (ns != m->ndim ||
				(ns && memcmp(mo + na, shape,
					      sizeof(int64_t) * (size_t)ns))))
			continue;
		k->hint = i + 1;
		return (long)j;
	}
	return -1;
}

/* Entry i of storage_metadata (key k, value v) into *x. */
static int parse_entry(loader *L, size_t i, const flx_pv *k, const flx_pv *v,
		       lti *x)
{
	const flx_pv *ls, *r;
	int rc;

	x->ns = -1;
	x->start = x->stop = x->rep = 0;
	if (!is_paddle_obj(k, "LocalTensorIndex") || !fields(k) ||
	    !(x->key = cstr(field(k, "tensor_key"))))
		return flx_error_set(L->err, -EINVAL, L->meta,
				     "storage_metadata",
				     "entry %zu: key is not a Paddle "
				     "LocalTensorIndex with a string "
				     "tensor_key",
				     i);
	if ((rc = dims_of(L, L->meta, x->key, "LocalTensorIndex.global_offset",
			  field(k, "global_offset"), &x->na, x->off)) ||
	    (rc = flag_of(L, x->key, k, "is_flattened", &x->flat)))
		return rc;
	if (x->flat && (rc = range_of(L, x->key, field(k, "flattened_range"),
				      &x->start, &x->stop)))
		return rc;
	ls = field(k, "local_shape");
	if (!is_none(ls) &&
	    (rc = dims_of(L, L->meta, x->key, "LocalTensorIndex.local_shape",
			  ls, &x->ns, x->shape)))
		return rc;
	r = field(k, "replica_id");
	if (!is_none(r) && (!flx_pv_int(r, &x->rep) || x->rep < 0))
		return flx_error_set(L->err, -EINVAL, L->meta, x->key,
				     "replica_id is not a non-negative "
				     "integer");
	if (!(x->file = cstr(v)))
		return flx_error_set(L->err, -EINVAL, L->meta, x->key,
				     "storage_metadata value is not a file "
				     "name");
	return 0;
}

/* The key (index *ki, or -2: look it up) and LTM (*m) of a primary entry
 * (replica_id 0 or None) whose file is x->file: 0 or -errno (err set). */
static int match_entry(loader *L, const lti *x, long *ki, long *m)
{
	if (*ki == -2)
		*ki = find_key(L, x->key);
	if (*ki < 0)
		return flx_error_set(L->err, -EINVAL, L->meta, x->key,
				     "storage_metadata names a key that "
				     "state_dict_metadata lacks");
	*m = match_ltm(L, &L->keys[*ki], x->na, x->off, x->flat, x->start,
		       x->stop, x->ns, x->shape);
	if (*m < 0) {
		char o[96];

		flx_fmt_dims(o, sizeof(o), x->na, x->off);
		return flx_error_set(L->err, -EINVAL, L->meta, x->key,
				     "no LocalTensorMetadata for the shard at "
				     "%s%s in %s",
				     o, x->flat ? " (flattened)" : "", x->file);
	}
	if ((unsigned long)*m >= UINT32_MAX)
		return flx_error_set(L->err, -EOVERFLOW, L->meta, x->key,
				     "more than 2^32 - 1 LocalTensorMetadata");
	return 0;
}

/* A primary entry into L->se: its key (index ki, or -2: look it up), LTM
 * and file (x->file, interned as L->istr[f]). */
static int resolve_entry(loader *L, const lti *x, long ki, uint32_t f)
{
	long m;
	sent *e;
	int rc = match_entry(L, x, &ki, &m);

	if (rc)
		return rc;
	if (flx_grow((void **)&L->se, &L->capse, L->nse + 1, sizeof(sent)))
		return -ENOMEM;
	e = &L->se[L->nse++];
	memset(e, 0, sizeof(*e));
	e->key = (uint32_t)ki;
	e->ltm = (uint32_t)m;
	e->pf = f;
	L->keys[ki].nse++;
	return 0;
}

static int intern(loader *L, const char *s, uint32_t *out);

static int decode_entry(loader *L, size_t i, const flx_pv *k, const flx_pv *v)
{
	lti x;
	uint32_t f;
	int rc = parse_entry(L, i, k, v, &x);

	/* replica_id > 0: a copy a loader ignores (save_replicas=True) */
	if (rc || x.rep > 0)
		return rc;
	/* the file name outlives the tree, which interpret() frees */
	if ((rc = intern(L, x.file, &f)))
		return rc == -ENOMEM
			   ? rc
			   : flx_error_set(L->err, -EOVERFLOW, L->meta,
					   "storage_metadata",
					   "more than 2^31 file names");
	x.file = L->istr[f];
	return resolve_entry(L, &x, -2, f);
}

/* Forget the streamed entries' records (se_sink()). */
static void drop_records(loader *L)
{
	drop(&L->raw);
	drop(&L->rdims);
	L->nraw = L->capraw = L->nrdims = L->caprdims = 0;
}

/* The streamed entries, in storage_metadata order, as decode_entry() takes
 * them from the tree; each key looked up once. */
static int resolve_streamed(loader *L)
{
	L->kmap = malloc((L->nistr ? L->nistr : 1) * sizeof(*L->kmap));
	L->se = malloc((L->nraw ? L->nraw : 1) * sizeof(*L->se));
	if (!L->kmap || !L->se)
		return -ENOMEM;
	L->capse = L->nraw ? L->nraw : 1;
	for (size_t i = 0; i < L->nistr; i++)
		L->kmap[i] = -2;
	for (size_t i = 0; i < L->nraw; i++) {
		const rawse *r = &L->raw[i];
		lti x = {.key = L->istr[r->key],
			 .file = L->istr[r->file],
			 .na = r->na,
			 .ns = r->ns,
			 .flat = r->flat};
		int rc;

		memcpy(x.off, L->rdims + r->dims,
		       sizeof(int64_t) * (size_t)r->na);
		if (r->ns > 0)
			memcpy(x.shape, L->rdims + r->dims + r->na,
			       sizeof(int64_t) * (size_t)r->ns);
		if (r->flat) {
			size_t at = r->dims + (size_t)r->na +
				    (size_t)(r->ns > 0 ? r->ns : 0);

			x.start = L->rdims[at];
			x.stop = L->rdims[at + 1];
		}
		if (L->kmap[r->key] == -2)
			L->kmap[r->key] = find_key(L, x.key);
		if ((rc = resolve_entry(L, &x, L->kmap[r->key], r->file)))
			return rc;
	}
	/* the entries are L->se now; the file names stay interned */
	drop_records(L);
	return 0;
}

static int load_storage(loader *L, const flx_pv *sm)
{
	if (L->streamed)
		return resolve_streamed(L);
	if (!sm || sm->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, L->meta,
				     "storage_metadata",
				     "missing or not a dict");
	for (size_t i = 0; i < sm->u.dict.n; i++) {
		int rc = decode_entry(L, i, sm->u.dict.kv[2 * i],
				      sm->u.dict.kv[2 * i + 1]);

		if (rc)
			return rc;
	}
	return 0;
}

/* flat_mapping: None, or a dict of str -> tuple of str (not used by the
 * index, whose keys are the flat ones; checked so that a damaged one is
 * not taken for Paddle's). */
static int check_flat_mapping(loader *L, const flx_pv *fm)
{
	if (is_none(fm))
		return 0;
	if (fm->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, L->meta, "flat_mapping",
				     "not a dict");
	for (size_t i = 0; i < fm->u.dict.n; i++) {
		const flx_pv *v = fm->u.dict.kv[2 * i + 1];
		bool ok = cstr(fm->u.dict.kv[2 * i]) && v &&
			  (v->kind == FLX_PV_TUPLE || v->kind == FLX_PV_LIST);

		for (size_t j = 0; ok && j < flx_pv_len(v); j++)
			ok = flx_pv_str(flx_pv_item(v, j)) != NULL;
		if (!ok)
			return flx_error_set(L->err, -EINVAL, L->meta,
					     "flat_mapping",
					     "entry %zu is not a string "
					     "mapped to a tuple of strings",
					     i);
	}
	return 0;
}

/* ---- .distcp files ---- */

/* numpy's dtype string ('f4', 'u2', ...) -> the element type as numpy
 * stores it (bfloat16 and float8 arrive as their unsigned bit patterns). */
static flx_dtype np_dtype(const char *s)
{
	static const struct {
		const char *np;
		flx_dtype dt;
	} map[] = {
	    {"f2", FLX_DT_F16}, {"f4", FLX_DT_F32},   {"f8", FLX_DT_F64},
	    {"i1", FLX_DT_I8},	{"i2", FLX_DT_I16},   {"i4", FLX_DT_I32},
	    {"i8", FLX_DT_I64}, {"u1", FLX_DT_U8},    {"u2", FLX_DT_U16},
	    {"u4", FLX_DT_U32}, {"u8", FLX_DT_U64},   {"b1", FLX_DT_BOOL},
	    {"c8", FLX_DT_C64}, {"c16", FLX_DT_C128},
	};

	for (size_t i = 0; s && i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(map[i].np, s))
			return map[i].dt;
	return FLX_DT_INVALID;
}

/* Whether a numpy array of type np holds elements of the metadata's type
 * md (docs/formats/paddle.md#bfloat16-and-float8: bf16 as uint16 bits, float8
 * as uint8 bits). */
static bool dtype_fits(flx_dtype md, flx_dtype np)
{
	if (md == np)
		return true;
	if (md == FLX_DT_BF16)
		return np == FLX_DT_U16;
	if (md == FLX_DT_F8_E4M3FN || md == FLX_DT_F8_E5M2 ||
	    md == FLX_DT_F8_E4M3FNUZ || md == FLX_DT_F8_E5M2FNUZ)
		return np == FLX_DT_U8;
	return false;
}

/* Whether cls is numpy.core.{sub}.{name} or numpy._core.{sub}.{name}
 * (compared in place: one call per array of every .distcp). */
static bool np_global(const flx_pv *cls, const char *sub, const char *name)
{
	const char *m;

	if (!flx_pv_is_global(cls, NULL, name))
		return false;
	m = cls->u.global.module;
	if (strncmp(m, "numpy.", 6))
		return false;
	m += 6;
	if (!strncmp(m, "core.", 5))
		m += 5;
	else if (!strncmp(m, "_core.", 6))
		m += 6;
	else
		return false;
	return !strcmp(m, sub);
}

/* numpy.dtype(str, ...) with BUILD state (3, byteorder, ...). */
static int decode_np_dtype(loader *L, const char *file, const char *key,
			   const flx_pv *v, flx_dtype *out)
{
	const flx_pv *st, *bo;
	const char *order;

	if (!v || v->kind != FLX_PV_OBJ ||
	    !flx_pv_is_global(v->u.obj.cls, "numpy", "dtype"))
		return flx_error_set(L->err, -EINVAL, file, key,
				     "array dtype is not a numpy.dtype");
	*out = np_dtype(cstr(flx_pv_item(v->u.obj.args, 0)));
	if (*out == FLX_DT_INVALID)
		return flx_error_set(L->err, -EINVAL, file, key,
				     "unsupported numpy dtype '%s'",
				     cstr(flx_pv_item(v->u.obj.args, 0))
					 ? cstr(flx_pv_item(v->u.obj.args, 0))
					 : "?");
	st = v->u.obj.state;
	bo = st && st->kind == FLX_PV_TUPLE ? flx_pv_item(st, 1) : NULL;
	order = cstr(bo);
	if (!order ||
	    (strcmp(order, "<") && strcmp(order, "|") && strcmp(order, "=")))
		return flx_error_set(L->err, -ENOTSUP, file, key,
				     "numpy dtype is not little-endian");
	return 0;
}

/* The bytes of an array: BYTES, or protocol 2's _codecs.encode(str,
 * 'latin1') when its text is the bytes themselves (all below 0x80). */
static int decode_raw(loader *L, const char *file, const char *key,
		      const flx_pv *v, uint64_t want, parr *a)
{
	uint64_t off;
	size_t len;

	if (v && v->kind == FLX_PV_OBJ &&
	    flx_pv_is_global(v->u.obj.cls, "_codecs", "encode")) {
		const flx_pv *s = flx_pv_item(v->u.obj.args, 0);
		const char *enc = cstr(flx_pv_item(v->u.obj.args, 1));

		if (!s || s->kind != FLX_PV_STR || !enc ||
		    strcmp(enc, "latin1") || !flx_pv_payload(s, &off, &len))
			return flx_error_set(L->err, -EINVAL, file, key,
					     "array bytes are not "
					     "_codecs.encode(str, 'latin1')");
		/* each byte is one or two bytes of UTF-8 */
		if (len < want || len / 2 > want)
			return flx_error_set(L->err, -EINVAL, file, key,
					     "protocol-2 array text of %zu "
					     "bytes cannot hold %" PRIu64
					     " bytes",
					     len, want);
		a->latin1 = len != want;
		a->off = off;
		a->len = len;
		return 0;
	} else if (!v || v->kind != FLX_PV_BYTES ||
		   !flx_pv_payload(v, &off, &len)) {
		return flx_error_set(L->err, -EINVAL, file, key,
				     "array data is not a bytes payload");
	}
	if (len != want)
		return flx_error_set(L->err, -EINVAL, file, key,
				     "array holds %zu bytes, its shape and "
				     "dtype need %" PRIu64,
				     len, want);
	a->off = off;
	a->len = len;
	return 0;
}

static int array_bytes(loader *L, const char *file, const char *key, parr *a,
		       uint64_t *bytes)
{
	if (flx_shape_bytes(a->ndim, ashape(L, a), flx_dtype_size(a->dtype),
			    NULL, bytes))
		return flx_error_set(L->err, -EOVERFLOW, file, key,
				     "array size overflows 64 bits");
	return 0;
}

/* One value of a .distcp dict: a numpy array, as protocol <= 4
 * (_reconstruct + BUILD) or protocol 5 (_frombuffer) pickles it. */
static int decode_array(loader *L, const char *file, const char *key,
			const flx_pv *v, parr *a)
{
	const flx_pv *cls = flx_pv_obj_class(v), *args, *st, *raw, *shape, *dt,
		     *order;
	int64_t shp[FLX_MAX_DIMS];
	uint64_t want;
	int n, rc;

	memset(a, 0, sizeof(*a));
	a->key = key;
	if (np_global(cls, "multiarray", "_reconstruct")) {
		const flx_pv *fo;

		st = v->u.obj.state;
		if (!st || st->kind != FLX_PV_TUPLE || flx_pv_len(st) != 5)
			return flx_error_set(L->err, -EINVAL, file, key,
					     "ndarray state is not (version, "
					     "shape, dtype, is_fortran, data)");
		shape = flx_pv_item(st, 1);
		dt = flx_pv_item(st, 2);
		fo = flx_pv_item(st, 3);
		raw = flx_pv_item(st, 4);
		a->fortran = fo && ((fo->kind == FLX_PV_BOOL && fo->u.b) ||
				    (fo->kind == FLX_PV_INT && fo->u.i));
	} else if (np_global(cls, "numeric", "_frombuffer")) {
		args = v->u.obj.args;
		if (flx_pv_len(args) != 4)
			return flx_error_set(L->err, -EINVAL, file, key,
					     "_frombuffer arguments are not "
					     "(buffer, dtype, shape, order)");
		raw = flx_pv_item(args, 0);
		dt = flx_pv_item(args, 1);
		shape = flx_pv_item(args, 2);
		order = flx_pv_item(args, 3);
		if (!cstr(order) ||
		    (strcmp(cstr(order), "C") && strcmp(cstr(order), "F")))
			return flx_error_set(L->err, -EINVAL, file, key,
					     "_frombuffer order is not 'C' or "
					     "'F'");
		a->fortran = !strcmp(cstr(order), "F");
	} else {
		return flx_error_set(L->err, -EINVAL, file, key,
				     "value is not a numpy array "
				     "(_reconstruct or _frombuffer)");
	}
	if ((rc = dims_of(L, file, key, "array shape", shape, &n, shp)) ||
	    (rc = set_ashape(L, file, key, a, n, shp)) ||
	    (rc = decode_np_dtype(L, file, key, dt, &a->dtype)) ||
	    (rc = array_bytes(L, file, key, a, &want)))
		return rc;
	return decode_raw(L, file, key, raw, want, a);
}

/* By key name: the keys' ranks (L->krank) are their name order. */
static int cmp_parr(const void *a, const void *b)
{
	uint32_t x = ((const parr *)a)->rank, y = ((const parr *)b)->rank;

	return (x > y) - (x < y);
}

/* Collect a file's "StructuredToParameterName@@" entries, for the keys
 * of the metadata only: per key the first name given and the first other
 * one (set_paddle() refuses two), in the files' order (flush_names()). */
static int add_names(loader *L, const char *file, const flx_pv *tab)
{
	if (!tab || tab->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, file, NAME_TABLE,
				     "not a dict");
	for (size_t i = 0; i < tab->u.dict.n; i++) {
		const char *k = cstr(tab->u.dict.kv[2 * i]);
		const char *n = cstr(tab->u.dict.kv[2 * i + 1]);
		const char **slot;
		long ki;

		if (!k || !n)
			return flx_error_set(L->err, -EINVAL, file, NAME_TABLE,
					     "entry %zu is not a string mapped "
					     "to a string",
					     i);
		if ((ki = find_key(L, k)) < 0)
			continue;
		slot = &L->kname[2 * ki];
		if (slot[0] && (slot[1] || !strcmp(slot[0], n)))
			continue;
		slot += slot[0] != NULL;
		if (!(*slot = pool_str(&L->c->pool, n)))
			return -ENOMEM;
	}
	return 0;
}

/* The part's names (add_names()) into L->names, key by key, each key's
 * first name first. */
static int flush_names(loader *L)
{
	for (size_t i = 0; i < 2 * L->nkeys; i++) {
		flx_name_pair *p;

		if (!L->kname[i])
			continue;
		if (flx_grow((void **)&L->names, &L->capnames, L->nnames + 1,
			     sizeof(*p)))
			return -ENOMEM;
		p = &L->names[L->nnames++];
		p->key = L->c->tensors[L->t0 + i / 2].fqn;
		p->name = L->kname[i];
	}
	return 0;
}

/* ---- arrays saved in pieces (docs/formats/paddle.md#arrays-saved-in-pieces)
 * ---- */

/* A name of a file's dict: a key with its value, or a slice name with the
 * key it is a piece of (owner; NULL for a key saved in pieces). */
typedef struct named {
	const char *name;
	const flx_pv *v;
	const char *owner;
} named;

static int cmp_named(const void *a, const void *b)
{
	return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* The entry of name in ix (sorted), or NULL; *twice when it is there more
 * than once. */
static const named *lookup(const named *ix, size_t n, const char *name,
			   bool *twice)
{
	named k = {.name = name};
	const named *e = bsearch(&k, ix, n, sizeof(named), cmp_named);

	*twice = e && ((e > ix && !strcmp(e[-1].name, name)) ||
		       (e + 1 < ix + n && !strcmp(e[1].name, name)));
	return e;
}

/* Slice i (named nv) of key's list, appended to pf->slices: a 1-D array of
 * the file of the dtype of the slices before it (*dt), holding elements
 * [*sum, *sum + its length) of the key's array, at most numel. */
static int decode_slice(loader *L, pfile *pf, const named *ix, size_t nix,
			const char *key, size_t i, const flx_pv *nv,
			uint64_t numel, flx_dtype *dt, uint64_t *sum)
{
	const char *name = cstr(nv);
	const named *e;
	bool twice;
	parr *s;
	char x[96];
	int rc;

	if (!name)
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": slice %zu is not a string "
						 "without NUL bytes",
				     i);
	e = lookup(ix, nix, name, &twice);
	if (!e)
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": slice '%s' is not in the "
						 "file",
				     name);
	if (twice)
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": slice '%s' appears twice "
						 "in the file",
				     name);
	if (pf->nslices >= UINT32_MAX)
		return flx_error_set(L->err, -EOVERFLOW, pf->relpath, key,
				     UNPACK_INFO ": more than 2^32 - 1 slices "
						 "in the file");
	if (flx_grow((void **)&pf->slices, &pf->capslices, pf->nslices + 1,
		     sizeof(parr)))
		return -ENOMEM;
	s = &pf->slices[pf->nslices];
	if ((rc = decode_array(L, pf->relpath, name, e->v, s)))
		return rc;
	if (s->ndim != 1) {
		flx_fmt_dims(x, sizeof(x), s->ndim, ashape(L, s));
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": slice '%s' has shape %s, "
						 "not one dimension",
				     name, x);
	}
	if (i && s->dtype != *dt)
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": slice '%s' is %s, the "
						 "slices before it %s",
				     name, flx_dtype_name(s->dtype),
				     flx_dtype_name(*dt));
	*dt = s->dtype;
	if ((uint64_t)ashape(L, s)[0] > numel - *sum)
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": the slices up to '%s' hold "
						 "more than the %" PRIu64
						 " elements of OriginShape",
				     name, numel);
	s->first = (int64_t)*sum;
	*sum += (uint64_t)ashape(L, s)[0];
	if (!(s->key = pool_str(&L->c->pool, name)))
		return -ENOMEM;
	pf->nslices++;
	return 0;
}

/* Entry key -> {"OriginShape": shape, "slices": [names]} of UNPACK_INFO:
 * *a becomes key's array, paddle.load's np.concatenate(slices).reshape(
 * OriginShape) (_pack_loaded_dict): the listed 1-D arrays of one dtype,
 * in order, holding together the elements of OriginShape in row-major
 * order (as ndarray.flatten() cut them).  Their lengths are taken as
 * they are (the writer's threshold is never assumed). */
static int decode_pieces(loader *L, pfile *pf, const named *ix, size_t nix,
			 const char *key, const flx_pv *v, parr *a)
{
	const flx_pv *os = flx_pv_dict_get(v, "OriginShape"),
		     *sl = flx_pv_dict_get(v, "slices");
	int64_t shp[FLX_MAX_DIMS];
	uint64_t numel, sum = 0;
	size_t n;
	char x[96];
	int nd, rc;

	memset(a, 0, sizeof(*a));
	a->key = key;
	if (!os || !sl)
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO " entry is not a dict with "
						 "OriginShape and slices");
	if ((rc = dims_of(L, pf->relpath, key, UNPACK_INFO " OriginShape", os,
			  &nd, shp)) ||
	    (rc = set_ashape(L, pf->relpath, key, a, nd, shp)))
		return rc;
	n = flx_pv_len(sl);
	if ((sl->kind != FLX_PV_LIST && sl->kind != FLX_PV_TUPLE) || !n)
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": slices is not a non-empty "
						 "list of names");
	if (flx_shape_bytes(a->ndim, ashape(L, a), 1, NULL, &numel))
		return flx_error_set(L->err, -EOVERFLOW, pf->relpath, key,
				     UNPACK_INFO ": OriginShape overflows 64 "
						 "bits");
	a->slice0 = (uint32_t)pf->nslices;
	for (size_t i = 0; i < n; i++)
		if ((rc = decode_slice(L, pf, ix, nix, key, i,
				       flx_pv_item(sl, i), numel, &a->dtype,
				       &sum)))
			return rc;
	a->nslices = (uint32_t)(pf->nslices - a->slice0);
	if (sum != numel) {
		flx_fmt_dims(x, sizeof(x), a->ndim, ashape(L, a));
		return flx_error_set(L->err, -EINVAL, pf->relpath, key,
				     UNPACK_INFO ": the slices hold %" PRIu64
						 " elements, OriginShape %s "
						 "needs %" PRIu64,
				     sum, x, numel);
	}
	return array_bytes(L, pf->relpath, key, a, &(uint64_t){0});
}

/* A name listed twice in *names (sorted): two keys saved in pieces, a
 * slice of two lists, or a slice that is itself saved in pieces. */
static int check_names(loader *L, const pfile *pf, const named *nm, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		const named *a = &nm[i - 1], *b = &nm[i];

		if (strcmp(a->name, b->name))
			continue;
		if (!a->owner && !b->owner)
			return flx_error_set(
			    L->err, -EINVAL, pf->relpath, a->name,
			    UNPACK_INFO " lists the key twice");
		if (!a->owner || !b->owner)
			return flx_error_set(L->err, -EINVAL, pf->relpath,
					     a->owner ? a->owner : b->owner,
					     UNPACK_INFO ": slice '%s' is "
							 "itself a key saved "
							 "in pieces",
					     a->name);
		return flx_error_set(L->err, -EINVAL, pf->relpath, b->owner,
				     UNPACK_INFO ": slice '%s' is listed "
						 "twice (for '%s' and '%s')",
				     a->name, a->owner, b->owner);
	}
	return 0;
}

/* A file's UNPACK_INFO: every entry checked and its slices recorded; the
 * arrays of the keys want marks appended to pf->arr at *n.  *names: the
 * keys saved in pieces (owner NULL) and every slice, sorted (the caller
 * frees it). */
static int read_pieces(loader *L, pfile *pf, const flx_pv *root,
		       const flx_pv *info, const bool *want, size_t *n,
		       named **names, size_t *nnames)
{
	size_t nr = root->u.dict.n, nix = 0, nn = 0, capnm = 0;
	named *ix = malloc((nr ? nr : 1) * sizeof(named)), *nm = NULL;
	int rc = 0;

	*names = NULL;
	*nnames = 0;
	if (!ix)
		return -ENOMEM;
	if (info->kind != FLX_PV_DICT) {
		rc = flx_error_set(L->err, -EINVAL, pf->relpath, UNPACK_INFO,
				   "not a dict");
		goto out;
	}
	for (size_t i = 0; i < nr; i++)
		if (cstr(root->u.dict.kv[2 * i]))
			ix[nix++] = (named){cstr(root->u.dict.kv[2 * i]),
					    root->u.dict.kv[2 * i + 1], NULL};
	qsort(ix, nix, sizeof(named), cmp_named);
	for (size_t i = 0; i < info->u.dict.n; i++) {
		const char *key = cstr(info->u.dict.kv[2 * i]);
		const flx_pv *v = info->u.dict.kv[2 * i + 1];
		size_t s0 = pf->nslices;
		long ki;
		parr a;

		if (!key) {
			rc = flx_error_set(L->err, -EINVAL, pf->relpath,
					   UNPACK_INFO,
					   "entry %zu: key is not a string "
					   "without NUL bytes",
					   i);
			goto out;
		}
		if ((rc = decode_pieces(L, pf, ix, nix, key,
					v && v->kind == FLX_PV_DICT ? v : NULL,
					&a)))
			goto out;
		if (flx_grow((void **)&nm, &capnm, nn + 1 + a.nslices,
			     sizeof(named))) {
			rc = -ENOMEM;
			goto out;
		}
		nm[nn++] = (named){key, NULL, NULL};
		for (size_t j = s0; j < pf->nslices; j++)
			nm[nn++] = (named){pf->slices[j].key, NULL, key};
		ki = find_key(L, key);
		if (ki < 0 || !want[ki])
			continue;
		if (!(a.key = pool_str(&L->c->pool, key))) {
			rc = -ENOMEM;
			goto out;
		}
		a.rank = L->krank[ki];
		pf->arr[(*n)++] = a;
	}
	qsort(nm, nn, sizeof(named), cmp_named);
	rc = check_names(L, pf, nm, nn);
out:
	free(ix);
	if (rc)
		free(nm);
	else {
		*names = nm;
		*nnames = nn;
	}
	return rc;
}

/* Decode file pf: its name table, and the arrays of the keys want marks
 * (those a primary storage entry names; other values are passed over
 * undecoded), sorted by key into pf->arr. */
static int read_distcp(loader *L, pfile *pf, const bool *want)
{
	/* strings longer than a name stay in the file: a protocol-2 file's
	 * array texts would otherwise all be copied into the tree */
	static const flx_pickle_limits lim = {.max_str = 64 * 1024};
	const flx_file *f = &L->c->files[pf->idx];
	flx_fd_reader ctx;
	flx_file_reader rctx;
	flx_reader r;
	flx_pickle *pk = NULL;
	const flx_pv *root, *info;
	unsigned char magic = 0;
	named *pieces = NULL;
	size_t n = 0, npieces = 0;
	int fd = -1, rc;

	/* a file another node holds (-o mpi) has no descriptor: its bytes
	 * come through the file table's backend */
	if (flx_file_is_remote(L->c, pf->idx)) {
		flx_reader_file(&r, &rctx, L->c, pf->idx, 0, f->size);
	} else {
		rc = flx_file_acquire(L->c, pf->idx, &fd);
		if (rc)
			return flx_error_set(L->err, rc, pf->relpath, NULL,
					     "cannot open: %s", strerror(-rc));
		flx_reader_fd(&r, &ctx, fd, 0, f->size);
	}
	if (f->size < 2 || flx_read_at(&r, &magic, 1, 0) || magic != 0x80) {
		rc = flx_error_set(L->err, -EINVAL, pf->relpath, NULL,
				   "not a pickle (PROTO opcode expected; "
				   "safetensors .distcp files are not "
				   "supported)");
		goto out;
	}
	rc = flx_pickle_load_reader(&r, pf->relpath, &lim, &pk, L->err);
	if (rc)
		goto out;
	root = flx_pickle_root(pk);
	if (!root || root->kind != FLX_PV_DICT) {
		rc = flx_error_set(L->err, -EINVAL, pf->relpath, NULL,
				   "not a pickled dict of arrays");
		goto out;
	}
	info = flx_pv_dict_get(root, UNPACK_INFO);
	pf->arr = calloc(root->u.dict.n + flx_pv_len(info) + 1, sizeof(parr));
	if (!pf->arr) {
		rc = -ENOMEM;
		goto out;
	}
	if (info &&
	    (rc = read_pieces(L, pf, root, info, want, &n, &pieces, &npieces)))
		goto out;
	for (size_t i = 0; i < root->u.dict.n; i++) {
		const char *k = cstr(root->u.dict.kv[2 * i]);
		const flx_pv *v = root->u.dict.kv[2 * i + 1];
		long ki;

		if (!k) {
			rc = flx_error_set(L->err, -EINVAL, pf->relpath, NULL,
					   "key %zu is not a string without "
					   "NUL bytes",
					   i);
			goto out;
		}
		if (!strcmp(k, NAME_TABLE)) {
			if ((rc = add_names(L, pf->relpath, v)))
				goto out;
			continue;
		}
		if (!strcmp(k, UNPACK_INFO))
			continue;
		ki = find_key(L, k);
		if (ki < 0 || !want[ki])
			continue;
		if (npieces) {
			bool twice;
			const named *p = lookup(pieces, npieces, k, &twice);

			if (p && !p->owner) {
				rc = flx_error_set(L->err, -EINVAL, pf->relpath,
						   k,
						   "saved both whole and in "
						   "pieces (" UNPACK_INFO ")");
				goto out;
			}
			if (p) {
				rc = flx_error_set(
				    L->err, -EINVAL, pf->relpath, k,
				    "is a slice of '%s' "
				    "(" UNPACK_INFO "), which paddle.load "
				    "removes",
				    p->owner);
				goto out;
			}
		}
		if ((rc = decode_array(L, pf->relpath, k, v, &pf->arr[n])))
			goto out;
		pf->arr[n].rank = L->krank[ki];
		pf->arr[n++].key = L->keys[ki].fqn;
	}
	pf->narr = n;
	qsort(pf->arr, n, sizeof(parr), cmp_parr);
	for (size_t i = 1; i < n; i++)
		if (!strcmp(pf->arr[i].key, pf->arr[i - 1].key)) {
			rc = flx_error_set(L->err, -EINVAL, pf->relpath,
					   pf->arr[i].key,
					   "key appears twice in the file");
			goto out;
		}
out:
	free(pieces);
	flx_pickle_free(pk);
	if (fd >= 0)
		flx_file_release(L->c, pf->idx);
	return rc;
}

/* The array of the key of rank r (L->krank) in pf, or NULL. */
static parr *find_arr(pfile *pf, uint32_t r)
{
	parr k = {.rank = r};

	return bsearch(&k, pf->arr, pf->narr, sizeof(parr), cmp_parr);
}

/* By file, then storage_metadata order: a file is opened for its first
 * entry, whose key names the file's own errors. */
/*
 * Protocol 2 writes an array's bytes as the UTF-8 text of a latin-1 str
 * (_codecs.encode(str, 'latin1')): a byte b >= 0x80 is two bytes, 0xc2 or
 * 0xc3 then 0x80 | (b & 0x3f), so no element can be sliced from the file
 * in place.  Such arrays are decoded once, at mount, into one memory file
 * (a memfd, at most MAX_DECODED bytes), which the index serves like any
 * data file.  a->off, a->len then name the decoded bytes.
 */
static int decode_latin1(loader *L, const pfile *pf, parr *a)
{
	unsigned char in[DECODE_BLOCK], out[DECODE_BLOCK];
	uint64_t want, pos = 0, at;
	size_t nout = 0;
	int hi = -1, rc;

	if ((rc = array_bytes(L, pf->relpath, a->key, a, &want)))
		return rc;
	if (want > MAX_DECODED - L->memdone - L->memlen)
		return flx_error_set(L->err, -EFBIG, pf->relpath, a->key,
				     "protocol-2 arrays (UTF-8 text of "
				     "latin-1) need more than %llu MiB "
				     "decoded at mount; re-save with "
				     "protocol 4 or 5",
				     MAX_DECODED >> 20);
	if (L->memfd < 0) {
		L->memfd = memfd_create("flexfs-paddle-latin1", MFD_CLOEXEC);
		if (L->memfd < 0)
			return flx_error_set(L->err, -errno, pf->relpath,
					     a->key,
					     "cannot make a memory file for "
					     "protocol-2 arrays: %s",
					     strerror(errno));
	}
	at = L->memlen;
	while (pos < a->len) {
		size_t n = a->len - pos < sizeof(in) ? (size_t)(a->len - pos)
						     : sizeof(in);

		rc = flx_file_pread(L->c, pf->idx, in, n, a->off + pos);
		if (rc)
			return flx_error_set(L->err, rc, pf->relpath, a->key,
					     "cannot read the array text: %s",
					     strerror(-rc));
		for (size_t i = 0; i < n; i++) {
			unsigned c = in[i];

			if (hi >= 0 && (c & 0xc0) == 0x80) {
				c = (unsigned)hi | (c & 0x3f);
				hi = -1;
			} else if (hi < 0 && (c == 0xc2 || c == 0xc3)) {
				hi = c == 0xc2 ? 0x80 : 0xc0;
				continue;
			} else if (hi >= 0 || c >= 0x80) {
				return flx_error_set(
				    L->err, -EINVAL, pf->relpath, a->key,
				    "protocol-2 array text is not latin-1 "
				    "(byte 0x%02x at offset %" PRIu64 ")",
				    c, a->off + pos + i);
			}
			if (L->memlen - at + nout == want)
				goto long_text;
			out[nout++] = (unsigned char)c;
			if (nout == sizeof(out)) {
				if (pwrite(L->memfd, out, nout,
					   (off_t)(L->memlen)) != (ssize_t)nout)
					goto write_fail;
				L->memlen += nout;
				nout = 0;
			}
		}
		pos += n;
	}
	if (nout &&
	    pwrite(L->memfd, out, nout, (off_t)L->memlen) != (ssize_t)nout)
		goto write_fail;
	L->memlen += nout;
	if (hi >= 0 || L->memlen - at != want)
		goto long_text;
	a->off = at;
	a->len = want;
	return 0;
long_text:
	return flx_error_set(L->err, -EINVAL, pf->relpath, a->key,
			     "protocol-2 array text does not decode to the "
			     "%" PRIu64 " bytes of its shape and dtype",
			     want);
write_fail:
	return flx_error_set(L->err, -ENOMEM, pf->relpath, a->key,
			     "cannot fill the memory file of protocol-2 "
			     "arrays");
}

/* Decode every protocol-2 text array and record the memory file. */
static int decode_texts(loader *L)
{
	int rc;

	for (size_t i = 0; i < L->nfiles; i++)
		for (size_t k = 0; k < L->files[i].narr; k++) {
			const parr *a = &L->files[i].arr[k];

			if (a->latin1 &&
			    (rc = decode_latin1(L, &L->files[i],
						&L->files[i].arr[k])))
				return rc;
			for (size_t j = a->slice0; j < a->slice0 + a->nslices;
			     j++)
				if (L->files[i].slices[j].latin1 &&
				    (rc =
					 decode_latin1(L, &L->files[i],
						       &L->files[i].slices[j])))
					return rc;
		}
	if (L->memfd < 0)
		return 0;
	rc = flx_build_decoded_file(L->b, "(protocol-2 arrays, decoded)",
				    L->memfd, &L->memfile);
	L->memfd = -1; /* the index's now, also on failure */
	L->memdone += L->memlen;
	L->memlen = 0;
	return rc;
}

static int cmp_istr(const void *a, const void *b, void *arg)
{
	const loader *L = arg;

	return strcmp(L->istr[*(const uint32_t *)a],
		      L->istr[*(const uint32_t *)b]);
}

/* order[0..nse): the entries by file name, then in storage_metadata
 * order: a counting sort by the rank of each entry's interned file name
 * (sent.pf) among the interned strings, which are distinct. */
static int order_by_file(loader *L, uint32_t *order)
{
	size_t n = L->nistr ? L->nistr : 1;
	uint32_t *ix = malloc(n * sizeof(*ix));
	size_t *at = calloc(n + 1, sizeof(*at));
	int rc = 0;

	if (!ix || !at) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < L->nistr; i++)
		ix[i] = (uint32_t)i;
	qsort_r(ix, L->nistr, sizeof(*ix), cmp_istr, L);
	/* ix becomes the rank of each string */
	for (size_t i = 0; i < L->nistr; i++)
		at[ix[i]] = i;
	for (size_t i = 0; i < L->nistr; i++)
		ix[i] = (uint32_t)at[i];
	memset(at, 0, (n + 1) * sizeof(*at));
	for (size_t i = 0; i < L->nse; i++)
		at[ix[L->se[i].pf] + 1]++;
	for (size_t r = 0; r < n; r++)
		at[r + 1] += at[r];
	for (size_t i = 0; i < L->nse; i++)
		order[at[ix[L->se[i].pf]]++] = (uint32_t)i;
out:
	free(ix);
	free(at);
	return rc;
}

/* Whether an array of shape[0..n) holds LTM m's shard: the block's shape,
 * or the flattened range's length. */
static bool holds_shard(const loader *L, const ltm *m, int n,
			const int64_t *shape)
{
	if (m->flat)
		return n == 1 && shape[0] == ltm_stop(L, m) - ltm_start(L, m);
	return n == m->ndim &&
	       (!n || !memcmp(shape, L->dims + m->dims + m->ndim,
			      sizeof(int64_t) * (size_t)n));
}

/* Append shape[0..n) to L->kept (fewer dims than L->adtotal, which
 * fits 32 bits): its place in *at.  @return 0 or -ENOMEM. */
static int keep_shape(loader *L, int n, const int64_t *shape, uint32_t *at)
{
	size_t pos;

	if (push_i64(&L->kept, &L->nkept, &L->capkept, n, shape, &pos))
		return -ENOMEM;
	*at = (uint32_t)pos;
	return 0;
}

/* What the tensors need of file f's arrays, once its entries took them:
 * each taken array's fields go to its entry, the slices' shapes and those
 * of the arrays that do not hold their LTM's shard (check_array() names
 * them) to L->kept; the file's arrays are freed.  @return 0 or -ENOMEM. */
static int settle_file(loader *L, pfile *f)
{
	int rc;

	for (size_t k = 0; k < f->nslices; k++) {
		parr *x = &f->slices[k];
		uint32_t at;

		if ((rc = keep_shape(L, x->ndim, ashape(L, x), &at)))
			return rc;
		x->sh = at;
	}
	for (size_t k = 0; k < f->narr; k++) {
		const parr *x = &f->arr[k];
		sent *e;

		if (!x->taken)
			continue;
		e = &L->se[x->taken - 1];
		e->sok =
		    holds_shard(L, &L->ltms[e->ltm], x->ndim, ashape(L, x));
		e->sh = 0;
		if (!e->sok &&
		    (rc = keep_shape(L, x->ndim, ashape(L, x), &e->sh)))
			return rc;
		e->off = x->off;
		e->slice0 = x->slice0;
		e->nslices = x->nslices;
		e->dtype = x->dtype;
		e->ndim = x->ndim;
		e->fortran = x->fortran;
		e->latin1 = x->latin1;
	}
	drop(&f->arr);
	f->narr = 0;
	f->settled = true;
	return 0;
}

/* Whether decode_texts() reads file f: an array or a slice of one is
 * protocol 2's latin-1 text. */
static bool has_text(const pfile *f)
{
	for (size_t k = 0; k < f->narr; k++) {
		const parr *a = &f->arr[k];

		if (a->latin1)
			return true;
		for (size_t j = a->slice0; j < a->slice0 + a->nslices; j++)
			if (f->slices[j].latin1)
				return true;
	}
	return false;
}

/* The file read last (its shapes last in L->adims), once its entries took
 * their arrays: settled now unless decode_texts() reads it, its shapes
 * then given back. */
static int settle_last(loader *L, size_t ad0)
{
	pfile *f = &L->files[L->nfiles - 1];
	int rc;

	if (has_text(f))
		return 0;
	if ((rc = settle_file(L, f)))
		return rc;
	L->nadims = ad0;
	return 0;
}

/* Entry i is the one shard its array a (of pf) holds: two entries naming
 * one file for one key would read the same bytes for two blocks. */
static int take_arr(loader *L, pfile *pf, parr *a, uint32_t i)
{
	const sent *e = &L->se[i];
	char x[96], y[96];

	if (!a->taken) {
		a->taken = i + 1;
		return 0;
	}
	flx_fmt_dims(x, sizeof(x), L->ltms[L->se[a->taken - 1].ltm].ndim,
		     L->dims + L->ltms[L->se[a->taken - 1].ltm].dims);
	flx_fmt_dims(y, sizeof(y), L->ltms[e->ltm].ndim,
		     L->dims + L->ltms[e->ltm].dims);
	return flx_error_set(L->err, -EINVAL, pf->relpath, L->keys[e->key].fqn,
			     "%s names this file for two shards of the key "
			     "(at %s and %s); a file holds one array per key",
			     L->meta, x, y);
}

/* Open and decode every file a primary storage entry names, in name
 * order, match each entry with its array and copy what the tensors need
 * of it into the entry; the files' arrays are freed then (their slices
 * stay). */
static int load_files(loader *L)
{
	uint32_t *order = NULL;
	bool *want = NULL;
	size_t ad0 = 0; /* the first shape of the file read last */
	int rc = 0;

	/* entries are numbered in 32 bits (order, parr.taken + 1) */
	if (L->nse >= UINT32_MAX)
		return flx_error_set(L->err, -EOVERFLOW, L->meta,
				     "storage_metadata",
				     "more than 2^32 - 2 primary entries");
	order = malloc((L->nse ? L->nse : 1) * sizeof(*order));
	want = calloc(L->nkeys ? L->nkeys : 1, sizeof(bool));
	if (!order || !want) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < L->nse; i++) {
		order[i] = (uint32_t)i;
		want[L->se[i].key] = true;
	}
	if ((rc = order_by_file(L, order)))
		goto out;
	for (size_t i = 0; i < L->nse; i++) {
		sent *e = &L->se[order[i]];
		const char *name = L->istr[e->pf];
		parr *a;
		pfile *pf;

		if (!L->nfiles || strcmp(L->files[L->nfiles - 1].name, name)) {
			flx_file_ref ref = {.from = L->meta,
					    .field = "storage_metadata",
					    .key = L->keys[e->key].fqn};

			/* the file before took its arrays */
			if (L->nfiles && (rc = settle_last(L, ad0)))
				goto out;
			ad0 = L->nadims;
			if (flx_grow((void **)&L->files, &L->capfiles,
				     L->nfiles + 1, sizeof(pfile))) {
				rc = -ENOMEM;
				goto out;
			}
			pf = &L->files[L->nfiles++];
			memset(pf, 0, sizeof(*pf));
			pf->relpath = pf->name = name;
			if (*L->prefix) {
				size_t p = strlen(L->prefix),
				       n = strlen(name) + 1;
				char *rp = flx_pool_alloc(&L->c->pool, p + n);

				if (!rp) {
					rc = -ENOMEM;
					goto out;
				}
				memcpy(rp, L->prefix, p);
				memcpy(rp + p, name, n);
				pf->relpath = rp;
			}
			rc = flx_build_data_file(L->b, pf->relpath, &ref,
						 &pf->idx);
			if (!rc)
				rc = read_distcp(L, pf, want);
			if (rc) {
				flx_error_key(L->err, ref.key);
				goto out;
			}
		}
		pf = &L->files[L->nfiles - 1];
		e->pf = (uint32_t)(pf - L->files);
		a = find_arr(pf, L->krank[e->key]);
		if (!a) {
			rc = flx_error_set(L->err, -EINVAL, pf->relpath,
					   L->keys[e->key].fqn,
					   "%s names this file for the key, "
					   "which the file lacks",
					   L->meta);
			goto out;
		}
		if ((rc = take_arr(L, pf, a, order[i])))
			goto out;
	}
	if ((L->nfiles && (rc = settle_last(L, ad0))) || (rc = decode_texts(L)))
		goto out;
	/* each entry took one array: the files decode_texts() read are
	 * settled too, and the shapes the tensors need are L->kept's */
	for (size_t i = 0; i < L->nfiles; i++)
		if (!L->files[i].settled && (rc = settle_file(L, &L->files[i])))
			goto out;
	free(L->adims);
	L->adims = L->kept;
	L->nadims = L->nkept;
	L->capadims = L->capkept;
	L->kept = NULL;
	L->nkept = L->capkept = 0;
out:
	free(order);
	free(want);
	return rc;
}

/* ---- tensors ---- */

/* Entry e's file (its relative path) and its array's shape, once
 * load_files() read them. */
static const char *efile(const loader *L, const sent *e)
{
	return L->files[e->pf].relpath;
}

static const int64_t *eshape(const loader *L, const sent *e)
{
	return L->adims + e->sh;
}

static int cmp_flat(const void *a, const void *b, void *arg)
{
	const loader *L = arg;
	const sent *x = &L->se[*(const uint32_t *)a];
	const sent *y = &L->se[*(const uint32_t *)b];
	const ltm *p = &L->ltms[x->ltm], *q = &L->ltms[y->ltm];
	int c = memcmp(L->dims + p->dims, L->dims + q->dims,
		       sizeof(int64_t) * 2 * (size_t)p->ndim);
	int64_t s = ltm_start(L, p), u = ltm_start(L, q);

	if (c)
		return c;
	return (s > u) - (s < u);
}

static bool same_block(const loader *L, const ltm *p, const ltm *q)
{
	return p->ndim == q->ndim &&
	       !memcmp(L->dims + p->dims, L->dims + q->dims,
		       sizeof(int64_t) * 2 * (size_t)p->ndim);
}

/* The flattened shards of a tensor (es[0..n), sorted by block and start)
 * must cover each block [0, numel) exactly once. */
static int check_flat(loader *L, const flx_tensor *t, const uint32_t *es,
		      size_t n)
{
	char o[96];

	for (size_t i = 0; i < n; i++) {
		const sent *e = &L->se[es[i]];
		const ltm *m = &L->ltms[e->ltm];
		const int64_t *blk = L->dims + m->dims + m->ndim;
		uint64_t numel = flx_numel(m->ndim, blk);
		bool first =
		    i == 0 || !same_block(L, m, &L->ltms[L->se[es[i - 1]].ltm]);
		bool last = i + 1 == n ||
			    !same_block(L, m, &L->ltms[L->se[es[i + 1]].ltm]);
		int64_t prev =
		    first ? 0 : ltm_stop(L, &L->ltms[L->se[es[i - 1]].ltm]);
		int64_t start = ltm_start(L, m), stop = ltm_stop(L, m);

		flx_fmt_dims(o, sizeof(o), m->ndim, L->dims + m->dims);
		if ((uint64_t)stop > numel)
			return flx_error_set(
			    L->err, -EINVAL, efile(L, e), t->fqn,
			    "flattened range [%" PRId64 ", %" PRId64
			    ") runs past the %" PRIu64
			    " elements of the block at %s",
			    start, stop, numel, o);
		if (start < prev)
			return flx_error_set(
			    L->err, -EINVAL, efile(L, e), t->fqn,
			    "flattened range [%" PRId64 ", %" PRId64
			    ") of the block at %s overlaps "
			    "another ending at %" PRId64,
			    start, stop, o, prev);
		if (start > prev)
			return flx_error_set(
			    L->err, -EINVAL, efile(L, e), t->fqn,
			    "flattened ranges of the block at "
			    "%s leave a hole: elements "
			    "[%" PRId64 ", %" PRId64 ") are in no file",
			    o, prev, start);
		if (last && (uint64_t)stop != numel)
			return flx_error_set(
			    L->err, -EINVAL, efile(L, e), t->fqn,
			    "flattened ranges of the block at "
			    "%s leave a hole: elements "
			    "[%" PRId64 ", %" PRIu64 ") are in no file",
			    o, stop, numel);
	}
	return 0;
}

/* The element type and global shape of key k: the metadata's (every LTM
 * must agree), else the arrays' type and the shards' extent. */
static int tensor_type(loader *L, const pkey *k, const uint32_t *es, size_t n,
		       flx_tensor *t)
{
	bool have_g = false;

	t->dtype = FLX_DT_INVALID;
	t->ndim = -1;
	for (size_t j = k->lo; j < k->lo + k->n; j++) {
		const ltm *m = &L->ltms[j];

		if (t->dtype && m->dtype && m->dtype != t->dtype)
			return flx_error_set(L->err, -EINVAL, L->meta, k->fqn,
					     "shards disagree on the dtype "
					     "(%s, %s)",
					     flx_dtype_name(t->dtype),
					     flx_dtype_name(m->dtype));
		if (m->dtype)
			t->dtype = m->dtype;
		if (t->ndim >= 0 && m->ndim != t->ndim)
			return flx_error_set(L->err, -EINVAL, L->meta, k->fqn,
					     "shards have %d and %d "
					     "dimensions",
					     t->ndim, m->ndim);
		if (t->ndim < 0) {
			t->ndim = m->ndim;
			memset(t->shape, 0, sizeof(t->shape));
		}
		if (m->gndim >= 0) {
			const int64_t *g = L->dims + m->gdims;

			if (m->gndim != t->ndim ||
			    (have_g &&
			     memcmp(g, t->shape,
				    sizeof(int64_t) * (size_t)t->ndim)))
				return flx_error_set(
				    L->err, -EINVAL, L->meta, k->fqn,
				    "shards disagree on the global_shape");
			memcpy(t->shape, g, sizeof(int64_t) * (size_t)t->ndim);
			have_g = true;
		}
	}
	if (t->ndim < 0)
		return flx_error_set(L->err, -EINVAL, L->meta, k->fqn,
				     "no LocalTensorMetadata for the key");
	if (!have_g) /* docs/formats/paddle.md#metadata-semantics:
			max(global_offset + local_shape) */
		for (size_t j = k->lo; j < k->lo + k->n; j++) {
			const ltm *m = &L->ltms[j];
			const int64_t *d = L->dims + m->dims;

			for (int a = 0; a < t->ndim; a++)
				if (d[a] + d[t->ndim + a] > t->shape[a])
					t->shape[a] = d[a] + d[t->ndim + a];
		}
	for (size_t i = 0; i < n; i++) {
		const sent *e = &L->se[es[i]];

		if (!t->dtype)
			t->dtype = e->dtype;
		if (!dtype_fits(t->dtype, e->dtype))
			return flx_error_set(
			    L->err, -EINVAL, efile(L, e), k->fqn,
			    "array dtype %s does not hold "
			    "the metadata's %s",
			    flx_dtype_name(e->dtype), flx_dtype_name(t->dtype));
	}
	if (flx_shape_bytes(t->ndim, t->shape, flx_dtype_size(t->dtype), NULL,
			    NULL))
		return flx_error_set(L->err, -EOVERFLOW, L->meta, k->fqn,
				     "tensor size overflows 64 bits");
	return 0;
}

/* The array of entry e holds its shard: the block's shape, or the
 * flattened range's length. */
static int check_array(loader *L, const flx_tensor *t, const sent *e)
{
	const ltm *m = &L->ltms[e->ltm];
	const int64_t *blk = L->dims + m->dims + m->ndim;
	char x[96], y[96];

	if (e->sok)
		return 0;
	if (m->flat) {
		if (e->ndim == 1 &&
		    eshape(L, e)[0] == ltm_stop(L, m) - ltm_start(L, m))
			return 0;
		flx_fmt_dims(x, sizeof(x), e->ndim, eshape(L, e));
		return flx_error_set(L->err, -EINVAL, efile(L, e), t->fqn,
				     "array shape %s is not that of the "
				     "flattened range [%" PRId64 ", %" PRId64
				     ")",
				     x, ltm_start(L, m), ltm_stop(L, m));
	}
	if (e->ndim == m->ndim &&
	    !memcmp(eshape(L, e), blk, sizeof(int64_t) * (size_t)m->ndim))
		return 0;
	flx_fmt_dims(x, sizeof(x), e->ndim, eshape(L, e));
	flx_fmt_dims(y, sizeof(y), m->ndim, blk);
	return flx_error_set(L->err, -EINVAL, efile(L, e), t->fqn,
			     "array shape %s differs from local_shape %s", x,
			     y);
}

/* Fill chunk ch of t, whose box and strides are set: element 0 is byte
 * at of file. */
static void chunk_at(flx_chunk *ch, const flx_tensor *t, uint32_t file,
		     uint64_t at)
{
	unsigned es = flx_dtype_size(t->dtype);

	ch->file = file;
	ch->data_off = ch->item_off = at;
	ch->item_len = flx_numel(t->ndim, ch->size) * es;
	ch->storage_offset = 0;
	ch->contig_from = flx_chunk_contig_from(t->ndim, ch);
}

/* Fill chunk ch: box (off, size) of t, whose element 0 is byte at of
 * file. */
static void set_chunk(flx_chunk *ch, const flx_tensor *t, uint32_t file,
		      const int64_t *off, const int64_t *size,
		      const int64_t *stride, uint64_t at)
{
	memcpy(ch->off, off, sizeof(int64_t) * (size_t)t->ndim);
	memcpy(ch->size, size, sizeof(int64_t) * (size_t)t->ndim);
	memcpy(ch->stride, stride, sizeof(int64_t) * (size_t)t->ndim);
	chunk_at(ch, t, file, at);
}

/* Row-major (or column-major) element strides of shape. */
static void strides_of(int n, const int64_t *shape, bool fortran, int64_t *st)
{
	int64_t s = 1;

	for (int i = 0; i < n; i++) {
		int d = fortran ? i : n - 1 - i;

		st[d] = s;
		s *= shape[d] ? shape[d] : 1;
	}
}

/* The axis the blocks of t's shards differ along (saved_split). */
static int split_of(const loader *L, const flx_tensor *t, const uint32_t *es,
		    size_t n)
{
	int axis = -1;

	for (int d = 0; d < t->ndim; d++)
		for (size_t i = 1; i < n; i++)
			if (L->dims[L->ltms[L->se[es[i]].ltm].dims +
				    (size_t)d] !=
			    L->dims[L->ltms[L->se[es[0]].ltm].dims +
				    (size_t)d]) {
				if (axis >= 0)
					return 0; /* several: the plan says */
				axis = d;
				break;
			}
	return axis < 0 ? -1 : axis + 1;
}

/*
 * A shard's array as runs of its block's row-major flattening: elements
 * [*start, *stop) at byte *at of file *file, laid out with the block's
 * row-major strides.  A flattened shard's array is one run; an array saved
 * in pieces one run per slice, wherever its cuts fall (the slices of a
 * flattened shard continue its range).  A whole block not in pieces has
 * none: it is one chunk with its own strides (C or Fortran order).
 *
 * Runs become box chunks (flx_flat_boxes()), which the index, its
 * coverage checks and every view read like any chunk; a chunk stays one
 * strided byte range of one file, so a run is never a chunk of its own
 * unless it falls on row boundaries.
 */
static size_t nruns(const loader *L, const sent *e)
{
	return e->nslices ? e->nslices : L->ltms[e->ltm].flat;
}

static void run_of(const loader *L, const sent *e, size_t i, int64_t *start,
		   int64_t *stop, uint32_t *file, uint64_t *at)
{
	const ltm *m = &L->ltms[e->ltm];
	int64_t base = ltm_start(L, m);

	if (e->nslices) {
		const parr *a = &L->files[e->pf].slices[e->slice0 + i];

		*start = base + a->first;
		*stop = *start + ashape(L, a)[0];
		*file = a->latin1 ? L->memfile : L->files[e->pf].idx;
		*at = a->off;
		return;
	}
	*start = base;
	*stop = ltm_stop(L, m);
	*file = e->latin1 ? L->memfile : L->files[e->pf].idx;
	*at = e->off;
}

/*
 * Whether t's chunks can be its shards' blocks read in place: each entry
 * of es[0..n) one whole block (no flattened range, no pieces) and their
 * LTMs' dims (global_offset then local_shape, decode_ltm()) a fixed step
 * apart in L->dims, as flx_tensor_pool_strides() asks; L->dims then
 * belongs to the index (L->dims_kept).
 */
static bool boxes_in_place(loader *L, const flx_tensor *t, const uint32_t *es,
			   size_t n)
{
	size_t d0, step = 2 * (size_t)t->ndim;

	if (t->ndim <= 0 || !n)
		return false;
	d0 = L->ltms[L->se[es[0]].ltm].dims;
	for (size_t i = 0; i < n; i++)
		if (nruns(L, &L->se[es[i]]) ||
		    L->ltms[L->se[es[i]].ltm].dims != d0 + i * step)
			return false;
	if (!L->dims_kept && !flx_pool_adopt(&L->c->pool, L->dims))
		L->dims_kept = true;
	return L->dims_kept;
}

static int build_tensor(loader *L, const pkey *k, const uint32_t *es, size_t n,
			flx_tensor *t)
{
	int64_t first[MAX_BOXES];
	uint32_t nch = 0, at = 0;
	size_t nflat = 0;
	int rc;

	if ((rc = tensor_type(L, k, es, n, t)))
		return rc;
	for (size_t i = 0; i < n; i++) {
		const sent *e = &L->se[es[i]];
		const ltm *m = &L->ltms[e->ltm];

		if (m->ndim != t->ndim)
			return flx_error_set(L->err, -EINVAL, L->meta, k->fqn,
					     "shards have %d and %d "
					     "dimensions",
					     t->ndim, m->ndim);
		/* inside the global shape (whose size fits 63 bits), so a
		 * block's element count and flattened offsets fit too */
		for (int d = 0; d < t->ndim; d++) {
			const int64_t *o = L->dims + m->dims;
			char x[96];

			if (o[d] + o[t->ndim + d] <= t->shape[d])
				continue;
			flx_fmt_dims(x, sizeof(x), t->ndim, o);
			return flx_error_set(L->err, -EINVAL, L->meta, k->fqn,
					     "the shard at %s lies outside the "
					     "global shape",
					     x);
		}
		if ((rc = check_array(L, t, e)))
			return rc;
		nflat += m->flat;
	}
	/* flattened shards first, sorted by block and start: checked, and
	 * their boxes counted */
	{
		uint32_t *fl = malloc((nflat ? nflat : 1) * sizeof(uint32_t));
		size_t j = 0;

		if (!fl)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++)
			if (L->ltms[L->se[es[i]].ltm].flat)
				fl[j++] = es[i];
		qsort_r(fl, nflat, sizeof(*fl), cmp_flat, L);
		rc = check_flat(L, t, fl, nflat);
		free(fl);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < n; i++) {
		const sent *e = &L->se[es[i]];
		const ltm *m = &L->ltms[e->ltm];
		int64_t lo[MAX_BOXES][FLX_MAX_DIMS],
		    sz[MAX_BOXES][FLX_MAX_DIMS], a, z;
		uint64_t at0;
		uint32_t f;
		unsigned nb;

		if (!nruns(L, e))
			nch++;
		for (size_t r = 0; r < nruns(L, e); r++) {
			run_of(L, e, r, &a, &z, &f, &at0);
			flx_flat_boxes(m->ndim, L->dims + m->dims + m->ndim, a,
				       z, lo, sz, first, &nb);
			nch += nb;
		}
	}
	if (boxes_in_place(L, t, es, n)) {
		/* the strides shared by the chunks in a row that have the
		 * same (flx_tensor_pool_place()) */
		flx_chunk *ch = flx_pool_alloc(&L->c->pool, nch * sizeof(*ch));

		if (!ch)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			ch[i].off = L->dims + L->ltms[L->se[es[i]].ltm].dims;
			ch[i].size = ch[i].off + t->ndim;
		}
		if ((rc = flx_tensor_pool_place(&L->c->pool, t, ch, nch)))
			return rc;
		for (size_t i = 0; i < n; i++) {
			const sent *e = &L->se[es[i]];
			int64_t st[FLX_MAX_DIMS];

			strides_of(t->ndim, ch[i].size, e->fortran, st);
			if ((rc = flx_chunk_set_strides(&ch[i], t->ndim, st,
							&L->c->pool)))
				return rc;
			chunk_at(&ch[i], t,
				 e->latin1 ? L->memfile : L->files[e->pf].idx,
				 e->off);
		}
		goto done;
	}
	if ((rc = flx_tensor_pool_chunks(&L->c->pool, t, nch)))
		return rc;
	for (size_t i = 0; i < n; i++) {
		const sent *e = &L->se[es[i]];
		const ltm *m = &L->ltms[e->ltm];
		const int64_t *off = L->dims + m->dims, *blk = off + m->ndim;
		unsigned esz = flx_dtype_size(t->dtype);
		int64_t st[FLX_MAX_DIMS], lo[MAX_BOXES][FLX_MAX_DIMS],
		    sz[MAX_BOXES][FLX_MAX_DIMS], g[FLX_MAX_DIMS], a, z;
		uint64_t data;
		uint32_t file;
		unsigned nb;

		if (!nruns(L, e)) {
			strides_of(t->ndim, blk, e->fortran, st);
			set_chunk(&t->chunks[at++], t,
				  e->latin1 ? L->memfile : L->files[e->pf].idx,
				  off, blk, st, e->off);
			continue;
		}
		strides_of(t->ndim, blk, false, st);
		for (size_t r = 0; r < nruns(L, e); r++) {
			run_of(L, e, r, &a, &z, &file, &data);
			if (z == a)
				continue;
			flx_flat_boxes(m->ndim, blk, a, z, lo, sz, first, &nb);
			for (unsigned b = 0; b < nb; b++) {
				for (int d = 0; d < t->ndim; d++)
					g[d] = off[d] + lo[b][d];
				set_chunk(
				    &t->chunks[at++], t, file, g, sz[b], st,
				    data + (uint64_t)(first[b] - a) * esz);
			}
		}
	}
done:
	t->saved_split = split_of(L, t, es, n);
	return flx_tensor_check_chunks(t, L->meta, L->err);
}

/* An array of its own pages, whose used start the tensors give back as
 * they are built (spent()): the entries in key order, and the LTMs when
 * the keys' come in key order (spend_entries()). */
typedef struct spend {
	char *p;
	size_t bytes, gone; /* mapped, and unmapped from the start */
} spend;

/* n * elem bytes mapped (sp->p NULL when they could not be). */
static void spend_map(spend *sp, size_t n, size_t elem)
{
	void *p;

	sp->p = NULL;
	sp->gone = 0;
	sp->bytes = (n ? n : 1) * elem;
	p = mmap(NULL, sp->bytes, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED)
		sp->p = p;
}

/* The pages wholly below byte used are not needed. */
static void spent(spend *sp, size_t used)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), end = used / pg * pg;

	if (sp->p && end > sp->gone) {
		munmap(sp->p + sp->gone, end - sp->gone);
		sp->gone = end;
	}
}

static void spend_free(spend *sp)
{
	if (sp->p && sp->bytes > sp->gone)
		munmap(sp->p + sp->gone, sp->bytes - sp->gone);
	sp->p = NULL;
}

/* The malloc'd array *arr of n elem-byte elements moved to pages of its
 * own, their length in *map.  @return 0 or -ENOMEM (*arr unchanged). */
static int to_pages(void *arr, size_t n, size_t elem, size_t *map)
{
	void **a = arr;
	spend m;

	spend_map(&m, n, elem);
	if (!m.p)
		return -ENOMEM;
	if (n)
		memcpy(m.p, *a, n * elem);
	free(*a);
	*a = m.p;
	*map = m.bytes;
	return 0;
}

/* L->ltms in pages of their own (L->ltm_map), which build_tensors() gives
 * back as it goes: moved while the loader holds little else (a streamed
 * metadata's tree freed, its entries not yet expanded). */
static int map_ltms(loader *L)
{
	if (to_pages(&L->ltms, L->nltms, sizeof(ltm), &L->ltm_map))
		return -ENOMEM;
	L->capltms = L->nltms;
	return 0;
}

/* Entry es[i] of L->se to place i, in place, each cycle of the permutation
 * es followed once; es then lists them in place. */
static void gather_entries(loader *L, uint32_t *es)
{
	for (size_t i = 0; i < L->nse; i++) {
		size_t j = i;
		sent t;

		if (es[i] == i)
			continue;
		t = L->se[i];
		while (es[j] != i) {
			size_t k = es[j];

			L->se[j] = L->se[k];
			es[j] = (uint32_t)j;
			j = k;
		}
		L->se[j] = t;
		es[j] = (uint32_t)j;
	}
}

/* The entries (L->se) in key order, storage_metadata order within a key
 * (as es lists them, which then lists them in place), in *se; the LTMs
 * (L->ltms) in *lt when each key's follow the key before's.  Each is
 * moved to pages of its own first where it is not there yet (to_pages()).
 * @return 0 or -ENOMEM. */
static int spend_entries(loader *L, uint32_t *es, spend *se, spend *lt)
{
	bool ordered = true;

	if (!L->se_map && to_pages(&L->se, L->nse, sizeof(sent), &L->se_map))
		return -ENOMEM;
	L->capse = L->nse;
	gather_entries(L, es);
	*se = (spend){.p = (char *)L->se, .bytes = L->se_map};
	L->se_map = 0;
	for (size_t i = 1; i < L->nkeys && ordered; i++)
		ordered = L->keys[i].lo >= L->keys[i - 1].lo + L->keys[i - 1].n;
	lt->p = NULL;
	if (!ordered || !L->nltms)
		return 0;
	if (!L->ltm_map && map_ltms(L))
		return -ENOMEM;
	*lt = (spend){.p = (char *)L->ltms, .bytes = L->ltm_map};
	L->ltm_map = 0;
	return 0;
}

static int build_tensors(loader *L)
{
	flx_ckpt *c = L->c;
	size_t *start = calloc(L->nkeys + 1, sizeof(size_t));
	uint32_t *es = malloc((L->nse ? L->nse : 1) * sizeof(uint32_t));
	spend sse = {0}, slt = {0};
	int rc = 0;

	size_t t0 = c->ntensors;
	flx_tensor *nt;

	L->t0 = t0;
	if (!start || !es)
		goto nomem;
	/* the parts' tensors one after another */
	nt = realloc(c->tensors, (t0 + L->nkeys + 1) * sizeof(flx_tensor));
	if (!nt)
		goto nomem;
	c->tensors = nt;
	memset(nt + t0, 0, (L->nkeys + 1) * sizeof(flx_tensor));
	/* entries grouped by key, in storage_metadata order within one */
	for (size_t i = 0; i < L->nkeys; i++)
		start[i + 1] = start[i] + L->keys[i].nse;
	for (size_t i = 0; i < L->nse; i++)
		es[start[L->se[i].key]++] = (uint32_t)i;
	for (size_t i = L->nkeys; i > 0; i--)
		start[i] = start[i - 1];
	start[0] = 0;
	/* what a tensor read is given back before the next is built */
	if ((rc = spend_entries(L, es, &sse, &slt)))
		goto out;
	for (size_t i = 0; i < L->nkeys; i++) {
		flx_tensor *t = &c->tensors[t0 + i];

		t->fqn = L->keys[i].fqn;
		c->ntensors = t0 + i + 1;
		rc = build_tensor(L, &L->keys[i], es + start[i], L->keys[i].nse,
				  t);
		if (rc)
			goto out;
		spent(&sse, (start[i] + L->keys[i].nse) * sizeof(sent));
		if (i + 1 < L->nkeys)
			spent(&slt, L->keys[i + 1].lo * sizeof(ltm));
	}
out:
	/* the entries and LTMs are the tensors' now, or no longer needed */
	if (sse.p) {
		spend_free(&sse);
		L->se = NULL;
		L->nse = L->capse = 0;
	}
	if (slt.p) {
		spend_free(&slt);
		L->ltms = NULL;
		L->nltms = L->capltms = 0;
	}
	free(start);
	free(es);
	return rc;
nomem:
	rc = -ENOMEM;
	goto out;
}

/* ---- the name table ---- */

static int cmp_pair(const void *a, const void *b)
{
	return strcmp(((const flx_name_pair *)a)->key,
		      ((const flx_name_pair *)b)->key);
}

/* flx_ckpt.paddle: the id and the merged name tables, sorted by key, one
 * name per key (the files must agree). */
static int set_paddle(loader *L)
{
	flx_paddle *p = flx_pool_alloc(&L->c->pool, sizeof(*p));
	size_t n = 0;

	if (!p)
		return -ENOMEM;
	if (L->nnames)
		qsort(L->names, L->nnames, sizeof(*L->names), cmp_pair);
	for (size_t i = 0; i < L->nnames; i++) {
		if (n && !strcmp(L->names[n - 1].key, L->names[i].key)) {
			if (strcmp(L->names[n - 1].name, L->names[i].name))
				return flx_error_set(
				    L->err, -EINVAL, NAME_TABLE,
				    L->names[i].key,
				    "the .distcp files name it both '%s' "
				    "and '%s'",
				    L->names[n - 1].name, L->names[i].name);
			continue;
		}
		L->names[n++] = L->names[i];
	}
	p->unique_id = (int64_t)L->id;
	p->nnames = n;
	p->names = flx_pool_alloc(&L->c->pool, (n ? n : 1) * sizeof(*p->names));
	if (!p->names)
		return -ENOMEM;
	if (n)
		memcpy(p->names, L->names, n * sizeof(*p->names));
	L->c->src_state = p;
	return 0;
}

/* ---- the source ---- */

/* A decimal id as Paddle names its files ("{id}.metadata"): digits
 * only, no sign, no leading zero but in "0". */
static int check_id(const flx_opt *o, const char *value, uint64_t *num,
		    flx_error *err)
{
	uint64_t v = 0;
	const char *p = value ? value : "";

	if (!*p || (p[0] == '0' && p[1]) || strlen(p) > 19)
		goto bad;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			goto bad;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	*num = v;
	return 0;
bad:
	return flx_error_set(err, -EINVAL, NULL, o->name,
			     "'%s' is not a checkpoint id (a decimal number)",
			     value ? value : "");
}

static const flx_opt paddle_opts[] = {
    {.name = "paddle_id",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "the highest in the directory",
     .help = "the unique id of a Paddle checkpoint to read",
     .check = check_id,
     .flags = FLX_OPT_BARE},
};

static const flx_opt_group paddle_group = {
    .owner = "paddle-dcp",
    .title = "Paddle Flex Checkpoint source",
    .opts = paddle_opts,
    .nopts = FLX_OPT_COUNT(paddle_opts),
};

static int paddle_fact(const flx_ckpt *c, const char *name, flx_fact *out)
{
	if (!c->src_state || strcmp(name, FLX_FACT_PADDLE))
		return -ENOENT;
	*out = (flx_fact){.type = FLX_FACT_PTR, .v.p = c->src_state};
	return 0;
}

void flx_paddle_attach(flx_ckpt *c, const flx_paddle *pd)
{
	c->src_state = pd;
	c->src_fact = pd ? paddle_fact : NULL;
}

/* ---- the metadata's per-chunk parts streamed ----
 *
 * A metadata of many chunks is mostly its LocalTensorMetadata objects
 * (the lists of state_dict_metadata) and its LocalTensorIndex -> file
 * pairs (storage_metadata).  flx_pickle_load_sink() hands both to the
 * sinks below batch by batch, which keep compact records (LTMs in L->ltms,
 * entries as rawse with interned strings) while the VM reuses the
 * objects' memory; load_sdm() and load_storage() then read those instead
 * of the tree.  Anything the records cannot stand for exactly (an item
 * or entry that does not decode, a list or pair also in the tree, a list
 * met elsewhere) declines, and the metadata is decoded again as a tree,
 * which gives the same index or the same message.
 *
 * Paddle pickles state_dict_metadata before storage_metadata, so the
 * first attempt (placed) also watches the pairs of state_dict_metadata
 * (sdm_watch(): key i's LTMs are the i-th list streamed) and matches each
 * primary entry with its LTM as it streams (place_entry(), 8 bytes an
 * entry); the entries' offsets and shapes are never kept.  An entry that
 * matches no LTM, or a pair or LTM after the first entry, declines to
 * the second attempt, which keeps the entries as rawse records and
 * matches them once the tree is freed (resolve_streamed()).
 */

/* Forget what the sinks took. */
static void stream_reset(loader *L)
{
	drop_records(L);
	drop(&L->pe);
	drop(&L->kmap);
	drop(&L->keys);
	drop(&L->ltm_ord);
	L->npe = L->cappe = L->nkmap = L->capkmap = L->nwk = L->capkeys = 0;
	L->nkeys = 0;
	L->se_on = L->place = false;
	drop(&L->sg);
	drop(&L->istr);
	drop(&L->itab);
	flx_pool_free(&L->spool);
	L->nsg = L->capsg = L->usedsg = 0;
	L->nistr = L->capistr = L->imask = 0;
	L->streamed = false;
	/* the LTMs and their dims came from the stream only */
	L->nltms = L->ndims = 0;
}

/* The interned index of s: 0 and *out, -ENOMEM, or -EAGAIN past 2^31
 * strings. */
static int intern(loader *L, const char *s, uint32_t *out)
{
	uint64_t h = str_hash(s);
	size_t i, n;
	char *c;

	if (!L->itab || 2 * (L->nistr + 1) > L->imask + 1) {
		size_t nmask = L->itab ? 2 * L->imask + 1 : 1023;
		uint32_t *nt = calloc(nmask + 1, sizeof(*nt));

		if (!nt)
			return -ENOMEM;
		for (size_t j = 0; j < L->nistr; j++) {
			for (i = str_hash(L->istr[j]) & nmask; nt[i];
			     i = (i + 1) & nmask)
				;
			nt[i] = (uint32_t)j + 1;
		}
		free(L->itab);
		L->itab = nt;
		L->imask = nmask;
	}
	for (i = h & L->imask; L->itab[i]; i = (i + 1) & L->imask)
		if (!strcmp(L->istr[L->itab[i] - 1], s)) {
			*out = L->itab[i] - 1;
			return 0;
		}
	if (L->nistr >= INT32_MAX)
		return -EAGAIN;
	if (flx_grow((void **)&L->istr, &L->capistr, L->nistr + 1,
		     sizeof(*L->istr)))
		return -ENOMEM;
	n = strlen(s) + 1;
	if (!(c = flx_pool_alloc(&L->spool, n)))
		return -ENOMEM;
	memcpy(c, s, n);
	L->istr[L->nistr] = c;
	L->itab[i] = (uint32_t)L->nistr + 1;
	*out = (uint32_t)L->nistr++;
	return 0;
}

/* Items of a list of state_dict_metadata: its LTMs, appended to L->ltms
 * (the list's batches must follow one another). */
static int ltm_sink(void *ctx, const flx_pv *list, flx_pv *const *v, size_t n)
{
	loader *L = ctx;
	flx_error scratch, *keep = L->err;
	int rc = 0;

	/* placed: a list's LTMs are its key's once its pair is watched */
	if (L->place && (L->se_on || (L->nsg && L->nsg - 1 < L->nwk &&
				      L->sg[L->nsg - 1].list == list)))
		return -EAGAIN;
	if (!L->nsg || L->sg[L->nsg - 1].list != list) {
		if (flx_grow((void **)&L->sg, &L->capsg, L->nsg + 1,
			     sizeof(*L->sg)))
			return -ENOMEM;
		L->sg[L->nsg++] = (sgroup){list, L->nltms, 0};
	}
	if (flx_grow((void **)&L->ltms, &L->capltms, L->nltms + n, sizeof(ltm)))
		return -ENOMEM;
	flx_error_init(&scratch);
	L->err = &scratch;
	for (size_t i = 0; i < n && !rc; i++)
		if (!(rc = decode_ltm(L, "", v[i], &L->ltms[L->nltms])))
			L->nltms++;
	L->err = keep;
	if (rc)
		return rc == -ENOMEM ? rc : -EAGAIN;
	L->sg[L->nsg - 1].n += n;
	return 0;
}

/* L->kmap for every interned string, the new ones -1 (no key). */
static int kmap_cover(loader *L)
{
	if (flx_grow((void **)&L->kmap, &L->capkmap, L->nistr,
		     sizeof(*L->kmap)))
		return -ENOMEM;
	for (; L->nkmap < L->nistr; L->nkmap++)
		L->kmap[L->nkmap] = -1;
	return 0;
}

/* Pairs of state_dict_metadata, placed: the i-th pair's key becomes key i
 * of L->keys, its LTMs those of the list streamed as L->sg[i] (whole: a
 * later batch of it declines, ltm_sink()).  A key named twice, a value
 * not that list, or a pair after the first entry declines, and the tree's
 * load reports what it reports. */
static int sdm_watch(void *ctx, flx_pv *const *kv, size_t npairs)
{
	loader *L = ctx;
	int rc;

	if (L->se_on || npairs > L->nsg - L->nwk ||
	    L->nwk + npairs > UINT32_MAX / 2)
		return -EAGAIN;
	if (flx_grow((void **)&L->keys, &L->capkeys, L->nwk + npairs,
		     sizeof(*L->keys)))
		return -ENOMEM;
	for (size_t j = 0; j < npairs; j++) {
		const char *key = cstr(kv[2 * j]);
		const sgroup *g = &L->sg[L->nwk];
		uint32_t id;

		if (!key || kv[2 * j + 1] != g->list)
			return -EAGAIN;
		if ((rc = intern(L, key, &id)) || (rc = kmap_cover(L)))
			return rc == -ENOMEM ? rc : -EAGAIN;
		if (L->kmap[id] >= 0)
			return -EAGAIN;
		L->kmap[id] = (long)L->nwk;
		L->keys[L->nwk++] =
		    (pkey){.fqn = (char *)L->istr[id], .lo = g->lo, .n = g->n};
	}
	return 0;
}

/* A primary entry of storage_metadata, placed: matched with its key's
 * LTMs as resolve_entry() matches it, into L->pe.  The first one ends
 * state_dict_metadata: its keys are counted and their LTMs sorted.
 * @return 0, -ENOMEM, or another -errno (err set) to decline. */
static int place_entry(loader *L, const lti *x, uint32_t ik, uint32_t f)
{
	long ki, m;
	int rc;

	if (!L->se_on) {
		L->se_on = true;
		L->nkeys = L->nwk;
		if ((rc = sort_ltms(L)))
			return rc;
	}
	if ((rc = kmap_cover(L)))
		return rc;
	ki = L->kmap[ik];
	if ((rc = match_entry(L, x, &ki, &m)))
		return rc;
	/* entries are fewer than 2^32 (load_files()) */
	if (L->npe >= UINT32_MAX - 1)
		return -EAGAIN;
	if (flx_grow((void **)&L->pe, &L->cappe, L->npe + 1, sizeof(*L->pe)))
		return -ENOMEM;
	L->pe[L->npe++] = (pent){f, (uint32_t)m};
	L->keys[ki].nse++;
	return 0;
}

/* The key whose LTMs [lo, lo + n) hold LTM j, placed: the keys' LTMs
 * follow one another in key order (their lists streamed in order). */
static uint32_t key_of_ltm(const loader *L, uint32_t j)
{
	size_t lo = 0, hi = L->nkeys;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (L->keys[mid].lo <= j)
			lo = mid;
		else
			hi = mid;
	}
	return (uint32_t)lo;
}

/* The entries placed (L->pe) as L->se, in storage_metadata order, in
 * pages of their own (L->se_map). */
static int expand_placed(loader *L)
{
	spend m;

	spend_map(&m, L->npe, sizeof(*L->se));
	if (!m.p)
		return -ENOMEM;
	L->se = (sent *)m.p;
	L->se_map = m.bytes;
	L->capse = L->npe ? L->npe : 1;
	for (size_t i = 0; i < L->npe; i++) {
		L->se[i].key = key_of_ltm(L, L->pe[i].ltm);
		L->se[i].pf = L->pe[i].pf;
		L->se[i].ltm = L->pe[i].ltm;
	}
	L->nse = L->npe;
	drop(&L->pe);
	drop(&L->kmap);
	L->npe = L->cappe = L->nkmap = L->capkmap = 0;
	return 0;
}

/* Pairs of storage_metadata: the primary entries, as rawse records (or,
 * placed, resolved: place_entry()). */
static int se_sink(void *ctx, flx_pv *const *kv, size_t npairs)
{
	loader *L = ctx;
	flx_error scratch, *keep = L->err;
	/* strings a batch names twice share their node */
	const char *lastk = NULL, *lastf = NULL;
	uint32_t ik = 0, jf = 0;
	int rc = 0;

	flx_error_init(&scratch);
	L->err = &scratch;
	for (size_t j = 0; j < npairs && !rc; j++) {
		lti x;
		rawse *r;
		size_t nd;

		if ((rc = parse_entry(L, 0, kv[2 * j], kv[2 * j + 1], &x)))
			break;
		if (x.rep > 0)
			continue;
		if (x.key != lastk && !(rc = intern(L, x.key, &ik)))
			lastk = x.key;
		if (!rc && x.file != lastf && !(rc = intern(L, x.file, &jf)))
			lastf = x.file;
		if (!rc && L->place) {
			x.file = L->istr[jf];
			rc = place_entry(L, &x, ik, jf);
			continue;
		}
		nd = (size_t)x.na + (size_t)(x.ns > 0 ? x.ns : 0) +
		     (x.flat ? 2 : 0);
		if (!rc && nd > UINT32_MAX - L->nrdims)
			rc = -EAGAIN;
		if (rc ||
		    (rc = flx_grow((void **)&L->raw, &L->capraw, L->nraw + 1,
				   sizeof(*L->raw))) ||
		    (rc = flx_grow((void **)&L->rdims, &L->caprdims,
				   L->nrdims + nd + 1, sizeof(*L->rdims))))
			break;
		r = &L->raw[L->nraw++];
		*r = (rawse){.key = ik,
			     .file = jf,
			     .dims = (uint32_t)L->nrdims,
			     .na = (int8_t)x.na,
			     .ns = (int8_t)x.ns,
			     .flat = x.flat};
		memcpy(L->rdims + L->nrdims, x.off,
		       sizeof(int64_t) * (size_t)x.na);
		if (x.ns > 0)
			memcpy(L->rdims + L->nrdims + x.na, x.shape,
			       sizeof(int64_t) * (size_t)x.ns);
		if (x.flat) {
			L->rdims[L->nrdims + nd - 2] = x.start;
			L->rdims[L->nrdims + nd - 1] = x.stop;
		}
		L->nrdims += nd;
	}
	L->err = keep;
	if (rc)
		return rc == -ENOMEM ? rc : -EAGAIN;
	return 0;
}

/* Whether what the sinks took stands for the metadata exactly: every pair
 * of storage_metadata went to se_sink() (or none did, nor any other
 * dict's), and each list ltm_sink() saw is, in order, a value of
 * state_dict_metadata that holds nothing in the tree; placed, also the
 * pairs sdm_watch() saw are that dict's, each value such a list. */
static bool stream_placed(loader *L, const flx_pickle *pk)
{
	const flx_pv *root = flx_pickle_root(pk), *sunk, *sm, *sdm;
	size_t used = 0;

	sunk = flx_pickle_sink_dict(pk);
	sm = is_paddle_obj(root, "Metadata") ? field(root, "storage_metadata")
					     : NULL;
	if (sunk ? sm != sunk || sm->u.dict.n : L->nraw || L->npe)
		return false;
	sdm = is_paddle_obj(root, "Metadata")
		  ? field(root, "state_dict_metadata")
		  : NULL;
	if (L->place &&
	    (!sdm || sdm->kind != FLX_PV_DICT || sdm->u.dict.n != L->nwk))
		return false;
	for (size_t i = 0; sdm && sdm->kind == FLX_PV_DICT && i < sdm->u.dict.n;
	     i++) {
		const flx_pv *v = sdm->u.dict.kv[2 * i + 1];
		const char *key = cstr(sdm->u.dict.kv[2 * i]);

		if (L->place && (!flx_pv_streamed(v) || !key ||
				 strcmp(key, L->keys[i].fqn)))
			return false;
		if (!flx_pv_streamed(v))
			continue;
		if (used == L->nsg || L->sg[used].list != v || flx_pv_len(v))
			return false;
		used++;
	}
	L->streamed = sunk != NULL;
	return used == L->nsg;
}

/* storage_metadata and flat_mapping of a streamed metadata *pk, whose
 * entries are records (resolve_streamed()): the tree is freed (*pk NULL)
 * before they are resolved, flat_mapping checked first and its refusal
 * reported where a tree's load reports it, after the entries'. */
static int storage_records(loader *L, flx_pickle **pk)
{
	const flx_pv *root = flx_pickle_root(*pk);
	flx_error fm, *keep = L->err;
	int rc, fm_rc;

	flx_error_init(&fm);
	L->err = &fm;
	fm_rc = check_flat_mapping(L, field(root, "flat_mapping"));
	L->err = keep;
	flx_pickle_free(*pk);
	*pk = NULL;
	/* the lists load_sdm() took were the tree's */
	drop(&L->sg);
	L->nsg = L->capsg = L->usedsg = 0;
	/* placed: the entries found their LTMs as they streamed */
	if (L->place)
		drop_ltm_ord(L);
	if ((rc = map_ltms(L)) ||
	    (rc = L->place ? expand_placed(L) : resolve_streamed(L)) ||
	    (rc = drop_ltm_ord(L)))
		return rc;
	if (fm_rc && L->err && !L->err->code)
		*L->err = fm;
	return fm_rc;
}

/* The index of the metadata *pk: its tree is freed (*pk NULL) once its
 * fields are read, before the .distcp files are. */
static int interpret(loader *L, flx_pickle **pk)
{
	const flx_pv *root = flx_pickle_root(*pk);
	const flx_pv *cls = flx_pv_obj_class(root);
	int rc;

	if (!is_paddle_obj(root, "Metadata") || !fields(root))
		return flx_error_set(
		    L->err, -EINVAL, L->meta, NULL,
		    "not a Paddle Metadata object (class %s%s%s)",
		    cls ? cls->u.global.module : flx_pv_kind_name(root),
		    cls ? "." : "", cls ? cls->u.global.name : "");
	/* the module's name outlives the tree: one of the two */
	L->module = strcmp(cls->u.global.module, MOD_FLEX) ? MOD_OLD : MOD_FLEX;
	if (!L->c->writer &&
	    asprintf(&L->c->writer, "Paddle %s (%s, id %" PRIu64 ")",
		     strcmp(L->module, MOD_FLEX) ? "checkpoint"
						 : "Flex Checkpoint",
		     L->module, L->id) < 0) {
		L->c->writer = NULL;
		return -ENOMEM;
	}
	/* placed: sorted when the first entry streamed */
	if ((rc = load_sdm(L, field(root, "state_dict_metadata"))) ||
	    (!L->ltm_ord && (rc = sort_ltms(L))))
		return rc;
	if (L->streamed)
		rc = storage_records(L, pk);
	else if (!(rc = load_storage(L, field(root, "storage_metadata"))) &&
		 !(rc = drop_ltm_ord(L)))
		rc = check_flat_mapping(L, field(root, "flat_mapping"));
	if (rc)
		return rc;
	/* the keys and file names are the loader's: the tree (most of a
	 * streamed metadata's memory left) is not needed */
	flx_pickle_free(*pk);
	*pk = NULL;
	if ((rc = load_files(L)) || (rc = build_tensors(L)))
		return rc;
	return flush_names(L);
}

/* What one metadata's load holds; the loader is ready for the next. */
static void part_release(loader *L)
{
	for (size_t i = 0; i < L->nfiles; i++) {
		free(L->files[i].arr);
		free(L->files[i].slices);
	}
	drop(&L->files);
	if (L->dims_kept)
		L->dims = NULL; /* the index's pool frees it */
	L->dims_kept = false;
	drop(&L->dims);
	drop(&L->adims);
	drop(&L->kept);
	drop_mapped(&L->ltms, &L->ltm_map);
	drop(&L->keys);
	drop(&L->by_name);
	drop(&L->krank);
	drop(&L->khash);
	drop(&L->ltm_ord);
	drop_mapped(&L->se, &L->se_map);
	drop(&L->kname);
	stream_reset(L);
	L->nadims = L->capadims = L->adtotal = L->nkept = L->capkept = 0;
	L->nfiles = L->capfiles = L->ndims = L->capdims = L->nltms =
	    L->capltms = 0;
	L->nkeys = L->nse = L->capse = 0;
}

static void loader_release(loader *L)
{
	part_release(L);
	free(L->names);
	if (L->memfd >= 0)
		close(L->memfd);
}

static bool want_distcp(const char *name)
{
	uint64_t id;

	return is_distcp_name(name, &id);
}

/* A streamed attempt: its per-chunk parts taken by the sinks, and all of
 * them placed (stream_placed()); in the first, the entries resolved as
 * they stream (placed: sdm_watch(), place_entry()), in the second kept
 * as records and resolved after (resolve_streamed()). */
static int load_attempt(void *ctx, unsigned k, const flx_reader *r,
			const flx_pickle_limits *lim, flx_pickle **pk)
{
	loader *L = ctx;
	const flx_pickle_sink sink = {.key = "storage_metadata",
				      .pairs = se_sink,
				      .ctx = L,
				      .items = ltm_sink,
				      .list_parent = "state_dict_metadata",
				      .watch_key =
					  k == 0 ? "state_dict_metadata" : NULL,
				      .watch = k == 0 ? sdm_watch : NULL};
	int rc;

	L->place = k == 0;
	rc = flx_pickle_load_sink(r, L->meta, lim, &sink, pk, L->err);
	if (!rc && !stream_placed(L, *pk)) {
		flx_pickle_free(*pk);
		*pk = NULL;
		rc = -EAGAIN;
	}
	return rc;
}

static void load_reset(void *ctx)
{
	stream_reset(ctx);
}

/* Decode L->meta, read forward through a window, its per-chunk parts
 * streamed, else decoded again as a tree (flx_build_load_pickle()). */
static int load_metadata(loader *L, flx_pickle **pk, int64_t *mtime)
{
	static const char missing[] = "no such file (is this a Paddle "
				      "checkpoint directory?)";

	return flx_build_load_pickle(L->b, L->meta, MAX_METADATA_BYTES, missing,
				     mtime, 2, load_attempt, load_reset, L, pk,
				     L->err);
}

/* Load one DCP directory: prefix "" (the checkpoint directory) or a
 * PaddleFormers part ("model_state/"). */
static int load_part(loader *L, const flx_ckpt_opts *o, const char *prefix)
{
	flx_pickle *pk = NULL;
	int64_t mtime;
	int rc;

	L->prefix = prefix;
	rc = pick_id(L, o);
	if (rc)
		return rc;
	rc = load_metadata(L, &pk, &mtime);
	if (!rc && !L->c->mtime_ns)
		L->c->mtime_ns = mtime;
	if (!rc)
		rc = interpret(L, &pk);
	flx_pickle_free(pk);
	part_release(L);
	return rc;
}

/* The checkpoint directory itself when it has a metadata file, else the
 * PaddleFormers parts it has. */
static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	loader L = {.b = b, .c = flx_build_ckpt(b), .err = err, .memfd = -1};
	int dirfd = flx_build_dirfd(b), rc = 0;
	ids s;

	rc = scan_ids(dirfd, 0, &s);
	if (rc)
		return flx_error_set(err, rc, NULL, NULL,
				     "cannot list the directory: %s",
				     strerror(-rc));
	scan_remote(b, "", 0, &s);
	flx_build_names_from(b, "<id>.metadata", "state_dict_metadata");
	if (s.any_meta) {
		const char *m;

		flx_build_prefetch(b, want_distcp);
		rc = load_part(&L, o, "");
		/* repeated names are reported against the metadata read */
		m = rc ? NULL : pool_str(&L.c->pool, L.meta);
		if (m)
			flx_build_names_from(b, m, "state_dict_metadata");
	} else {
		size_t parts = 0;

		for (size_t i = 0; i < NPARTS && !rc; i++) {
			char prefix[32];
			int sub = open_part(dirfd, formers_parts[i]);

			if (sub >= 0)
				close(sub);
			else if (!remote_part(b, formers_parts[i]))
				continue;
			snprintf(prefix, sizeof(prefix), "%s/",
				 formers_parts[i]);
			rc = load_part(&L, o, prefix);
			parts++;
		}
		/* reached with -o source_format=paddle-dcp only: the probe
		 * found neither */
		if (!rc && !parts)
			rc = flx_error_set(err, -ENOENT, "<id>.metadata", NULL,
					   "no such file, nor %s/ (is this a "
					   "Paddle Flex Checkpoint directory?)",
					   formers_parts[0]);
	}
	if (!rc)
		rc = set_paddle(&L);
	loader_release(&L);
	return rc;
}

const flx_source flx_source_paddle = {
    .name = "paddle-dcp",
    .kind = "Paddle Flex Checkpoint",
    .marker = "<id>.metadata",
    .probe = probe,
    .owns = owns,
    .metadata = "*.metadata",
    .load = load,
    .opts = &paddle_group,
    .fact = paddle_fact,
};
