/* SPDX-License-Identifier: MIT */
/*
 * torch.save zip files; see torchsave.h.  Records are numbered
 *
 *   0 data.pkl, 1 byteorder, 2 + k data/<k> (k < ns), ns + 2 version
 *
 * where storage k is the k-th entry holding a tensor (ns of them; a None
 * has none) *
 * and every offset follows from the record sizes
 * (docs/formats/torch-save.md#entry-layout), computed once at build.  Pieces:
 * the header of data.pkl, the pickle (its head, its entries by batches, its
 * tail), what lies between data.pkl and the first tensor, after each tensor
 * what lies up to the next one (its data descriptor, the next local header, and
 * the small records between), the central directory by batches, and the end
 * records.
 */
#include "torchsave.h"

#include "crc32.h"
#include "compat.h"
#include "json_internal.h"
#include "names.h"
#include "pickle_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define ZIP_MAX32 0xFFFFFFFFull
/* the archive's folder: what torch.save writes to a buffer */
#define PT_PREFIX "archive/"
/* "archive/data/" and a 20-digit key */
#define PT_NAME_MAX 40

/* A torch.save file (owned by the fs). */
typedef struct pt_file {
	const flx_pt_set *set;
	int tp;		/* see flx_pt_add_file() */
	size_t ns;	/* storages */
	uint32_t *ent;	/* storage k -> its entry */
	uint32_t *key;	/* entry -> its storage (entries with a tensor) */
	uint64_t *h;	/* local header offset of each record; h[nrec]: the
			 * central directory's */
	uint64_t pkl;	/* data.pkl's length */
	uint32_t crc;	/* data.pkl's CRC-32 */
	uint64_t cdlen; /* the central directory's length */
} pt_file;

static const char byteorder[] = "little";
static const char version[] = "3\n";

/* torch 1.13's unpickler knows the typed storage classes of
 * torch/storage.py (_rebuild_tensor_v2) and no _rebuild_tensor_v3
 * (torch/_utils.py, from 2.1), so it loads no file holding a dtype without
 * a storage class; those dtypes came with torch 2.1 (float8_e4m3fn,
 * float8_e5m2), 2.2 (the FNUZ float8s) and 2.3 (uint16/32/64).
 * docs/formats/torch-save.md#dtypes-older-readers-cannot-load */
const flx_fmt_dtypes flx_pt_dtypes = {
    .name = "torch.save",
    .older =
	{
	    [FLX_DT_U16] = "torch 1.13 has no uint16 (torch >= 2.3 loads it)",
	    [FLX_DT_U32] = "torch 1.13 has no uint32 (torch >= 2.3 loads it)",
	    [FLX_DT_U64] = "torch 1.13 has no uint64 (torch >= 2.3 loads it)",
	    [FLX_DT_F8_E4M3FN] = "torch 1.13 has no float8_e4m3fn (torch >= "
				 "2.1 loads it)",
	    [FLX_DT_F8_E5M2] = "torch 1.13 has no float8_e5m2 (torch >= 2.1 "
			       "loads it)",
	    [FLX_DT_F8_E4M3FNUZ] = "torch 1.13 has no float8_e4m3fnuz (torch "
				   ">= 2.2 loads it)",
	    [FLX_DT_F8_E5M2FNUZ] = "torch 1.13 has no float8_e5m2fnuz (torch "
				   ">= 2.2 loads it)",
	},
};

static size_t nrec(const pt_file *f)
{
	return f->ns + 3;
}

/* Entry i's view, NULL for a tensor of parts or None. */
static const flx_view *pt_view(const pt_file *f, size_t i)
{
	const flx_placement *pl = f->set->e[i].pl;

	if (!pl)
		return NULL;
	return f->tp < 0 ? pl->whole
			 : flx_placement_view(pl, f->set->stage, f->tp,
					      f->set->ntp ? f->set->ntp : 1);
}

static bool has_tensor(const flx_pt_entry *e)
{
	return e->pl || e->t;
}

/* Bytes of part p. */
static uint64_t part_bytes(const flx_pt_part *p)
{
	if (p->view)
		return flx_view_bytes(p->view);
	return p->file ? p->len : p->zeros;
}

/* Bytes of entry i's tensor. */
static uint64_t ent_bytes(const pt_file *f, size_t i)
{
	const flx_pt_tensor *t = f->set->e[i].t;
	uint64_t n = 0;

	if (pt_view(f, i))
		return flx_view_bytes(pt_view(f, i));
	for (size_t k = 0; t && k < t->nparts; k++)
		n += part_bytes(&t->parts[k]);
	return n;
}

static uint64_t rec_size(const pt_file *f, size_t r)
{
	if (r == 0)
		return f->pkl;
	if (r == 1)
		return sizeof(byteorder) - 1;
	if (r == nrec(f) - 1)
		return sizeof(version) - 1;
	return ent_bytes(f, f->ent[r - 2]);
}

static uint32_t rec_crc(const pt_file *f, size_t r)
{
	if (r == 0)
		return f->crc;
	if (r == 1)
		return flx_crc32(0, (const unsigned char *)byteorder,
				 sizeof(byteorder) - 1);
	if (r == nrec(f) - 1)
		return flx_crc32(0, (const unsigned char *)version,
				 sizeof(version) - 1);
	return 0; /* tensors: never checked by torch.load */
}

/* The full name of record r in out (PT_NAME_MAX + 1 bytes); its length. */
static size_t rec_name(const pt_file *f, size_t r, char *out)
{
	size_t n = sizeof(PT_PREFIX) - 1;
	const char *s = NULL;

	memcpy(out, PT_PREFIX, n);
	if (r == 0)
		s = "data.pkl";
	else if (r == 1)
		s = "byteorder";
	else if (r == nrec(f) - 1)
		s = "version";
	if (s) {
		strcpy(out + n, s);
		return n + strlen(s);
	}
	memcpy(out + n, "data/", 5);
	n += 5;
	n += (size_t)flx_fmt_int(out + n, (int64_t)(r - 2), 1);
	out[n] = '\0';
	return n;
}

/* Length of the ZIP64 extra field of a record of size s at h (0: none). */
static uint64_t zip64_len(uint64_t s, uint64_t h)
{
	bool big = s >= ZIP_MAX32, far = h >= ZIP_MAX32;

	return big || far ? 4 + 16 * big + 8 * far : 0;
}

/* 'Z' bytes of the "FB" field, which put the data at a multiple of 64. */
static uint64_t fb_pad(uint64_t h, size_t l, uint64_t z)
{
	return (64 - (h + 30 + l + z + 4) % 64) % 64;
}

/* Length of the data descriptor of a record of size s at h. */
static uint64_t desc_len(uint64_t s, uint64_t h)
{
	if (s == 0)
		return 0;
	return zip64_len(s, h) ? 24 : 16;
}

static void put_zeros(flx_jw *w, uint64_t n, unsigned char c)
{
	unsigned char b[64];

	memset(b, c, sizeof(b));
	while (n) {
		size_t k = n < sizeof(b) ? (size_t)n : sizeof(b);

		flx_jw_raw(w, b, k);
		n -= k;
	}
}

/* The local header of record r, its name and its extra field. */
static void put_lfh(flx_jw *w, const pt_file *f, size_t r)
{
	char name[PT_NAME_MAX + 1];
	size_t l = rec_name(f, r, name);
	uint64_t h = f->h[r], s = rec_size(f, r), z = zip64_len(s, h);
	uint64_t pad = fb_pad(h, l, z);

	flx_pk_le(w, 0x04034b50, 4);
	flx_pk_le(w, 0, 2);		      /* version needed */
	flx_pk_le(w, s ? 0x0808 : 0x0800, 2); /* descriptor, UTF-8 */
	flx_pk_le(w, 0, 2);		      /* stored */
	flx_pk_le(w, 0, 4);		      /* time, date */
	flx_pk_le(w, 0, 4);		      /* CRC: in the descriptor */
	flx_pk_le(w, 0, 8);		      /* sizes: in the descriptor */
	flx_pk_le(w, l, 2);
	flx_pk_le(w, z + 4 + pad, 2);
	flx_jw_raw(w, name, l);
	if (z) {
		flx_pk_le(w, 1, 2);
		flx_pk_le(w, z - 4, 2);
		if (s >= ZIP_MAX32) {
			flx_pk_le(w, s, 8);
			flx_pk_le(w, 0, 8);
		}
		if (h >= ZIP_MAX32)
			flx_pk_le(w, h, 8);
	}
	flx_pk_le(w, 0x4246, 2); /* "FB" */
	flx_pk_le(w, pad, 2);
	put_zeros(w, pad, 'Z');
}

static void put_desc(flx_jw *w, const pt_file *f, size_t r)
{
	uint64_t s = rec_size(f, r);
	int n = zip64_len(s, f->h[r]) ? 8 : 4;

	if (!s)
		return;
	flx_pk_le(w, 0x08074b50, 4);
	flx_pk_le(w, rec_crc(f, r), 4);
	flx_pk_le(w, s, n);
	flx_pk_le(w, s, n);
}

/* Record r's local header; for the small records their data and
 * descriptor too (a tensor's data is a view segment). */
static void put_open(flx_jw *w, const pt_file *f, size_t r)
{
	put_lfh(w, f, r);
	if (r == 1)
		flx_jw_raw(w, byteorder, sizeof(byteorder) - 1);
	else if (r == nrec(f) - 1)
		flx_jw_raw(w, version, sizeof(version) - 1);
	else
		return;
	put_desc(w, f, r);
}

/* OrderedDict() */
static void pk_odict(flx_jw *w)
{
	flx_pk_global(w, "collections", "OrderedDict");
	flx_jw_raw(w, ")R", 2);
}

/* The dict's head: PROTO 2, OrderedDict(), MARK of its items. */
static int pk_head(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	const pt_file *f = arg;
	flx_jw w = flx_jw_window(dst, lo, hi);

	(void)idx;
	flx_jw_raw(&w, "\x80\x02", 2);
	if (f->set->npre)
		flx_jw_raw(&w, f->set->pre, f->set->npre);
	pk_odict(&w);
	if (f->set->n)
		flx_jw_raw(&w, "(", 1);
	return flx_jw_end(&w, len);
}

/*
 * Items idx.. (a batch): name, then the tensor as torch pickles it:
 * _rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()),
 * storage the persistent id ('storage', <class>, '<k>', 'cpu', numel);
 * for a dtype without a storage class _rebuild_tensor_v3 with the dtype
 * last and an UntypedStorage, numel counted in bytes.
 */
static int pk_items(const void *arg, uint32_t idx, unsigned char *dst,
		    uint64_t lo, uint64_t hi, uint64_t *len)
{
	const pt_file *f = arg;
	flx_jw w = flx_jw_window(dst, lo, hi);

	for (size_t k = idx; k < f->set->n && k < idx + FLX_GEN_BATCH; k++) {
		const flx_view *v = pt_view(f, k);
		const flx_pt_tensor *t = f->set->e[k].t;
		const flx_dtype_info *dt;
		const int64_t *shape;
		int nd;
		uint64_t size[FLX_MAX_DIMS], stride[FLX_MAX_DIMS], numel = 1;
		char key[24];

		if (f->set->e[k].next_dict) {
			/* SETITEMS, then key: OrderedDict(), MARK */
			flx_jw_raw(&w, "u", 1);
			flx_pk_str(&w, f->set->e[k].name);
			pk_odict(&w);
			flx_jw_raw(&w, "(", 1);
			continue;
		}
		flx_pk_str(&w, f->set->e[k].name);
		if (!has_tensor(&f->set->e[k])) {
			flx_jw_raw(&w, "N", 1);
			continue;
		}
		dt = flx_dtype_get(v ? flx_view_tensor(v)->dtype : t->dtype);
		nd = v ? flx_view_tensor(v)->ndim : t->ndim;
		shape = v ? flx_view_box(v)->size : t->shape;
		for (int d = nd - 1; d >= 0; d--) {
			/* contiguous strides, as torch computes them */
			stride[d] = numel;
			size[d] = (uint64_t)shape[d];
			numel *= size[d] ? size[d] : 1;
		}
		key[flx_fmt_int(key, (int64_t)f->key[k], 1)] = '\0';
		flx_pk_global(&w, "torch._utils",
			      dt->storage ? "_rebuild_tensor_v2"
					  : "_rebuild_tensor_v3");
		flx_jw_raw(&w, "((", 2);
		flx_pk_str(&w, "storage");
		if (dt->storage)
			flx_pk_global(&w, "torch", dt->storage);
		else
			flx_pk_global(&w, "torch.storage", "UntypedStorage");
		flx_pk_str(&w, key);
		flx_pk_str(&w, "cpu");
		flx_pk_int(&w, dt->storage ? ent_bytes(f, k) / dt->size
					   : ent_bytes(f, k));
		flx_jw_raw(&w, "tQ", 2);
		flx_pk_int(&w, 0);
		flx_pk_ints(&w, nd, size);
		flx_pk_ints(&w, nd, stride);
		flx_jw_raw(&w, "\x89", 1);
		pk_odict(&w);
		if (!dt->storage)
			flx_pk_global(&w, "torch", dt->torch);
		flx_jw_raw(&w, "tR", 2);
	}
	return flx_jw_end(&w, len);
}

/* SETITEMS, STOP */
static int pk_tail(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	const pt_file *f = arg;
	flx_jw w = flx_jw_window(dst, lo, hi);

	(void)idx;
	if (f->set->n)
		flx_jw_raw(&w, "u", 1);
	if (f->set->npost)
		flx_jw_raw(&w, f->set->post, f->set->npost);
	flx_jw_raw(&w, ".", 1);
	return flx_jw_end(&w, len);
}

/* data.pkl's local header (at 0). */
static int pt_head(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	flx_jw w = flx_jw_window(dst, lo, hi);

	(void)idx;
	put_lfh(&w, arg, 0);
	return flx_jw_end(&w, len);
}

/* After data.pkl: its descriptor, byteorder, the next record's header. */
static int pt_after_pkl(const void *arg, uint32_t idx, unsigned char *dst,
			uint64_t lo, uint64_t hi, uint64_t *len)
{
	flx_jw w = flx_jw_window(dst, lo, hi);

	(void)idx;
	put_desc(&w, arg, 0);
	put_open(&w, arg, 1);
	put_open(&w, arg, 2);
	return flx_jw_end(&w, len);
}

/* After storage idx: its descriptor, the next record's header (and when
 * that is version, the record whole). */
static int pt_between(const void *arg, uint32_t idx, unsigned char *dst,
		      uint64_t lo, uint64_t hi, uint64_t *len)
{
	flx_jw w = flx_jw_window(dst, lo, hi);

	put_desc(&w, arg, (size_t)idx + 2);
	put_open(&w, arg, (size_t)idx + 3);
	return flx_jw_end(&w, len);
}

/* Central directory entries of records idx.. (a batch). */
static int pt_cd(const void *arg, uint32_t idx, unsigned char *dst, uint64_t lo,
		 uint64_t hi, uint64_t *len)
{
	const pt_file *f = arg;
	flx_jw w = flx_jw_window(dst, lo, hi);

	for (size_t r = idx; r < nrec(f) && r < idx + FLX_GEN_BATCH; r++) {
		char name[PT_NAME_MAX + 1];
		size_t l = rec_name(f, r, name);
		uint64_t h = f->h[r], s = rec_size(f, r), z = zip64_len(s, h);

		flx_pk_le(&w, 0x02014b50, 4);
		flx_pk_le(&w, 0, 2); /* made by */
		flx_pk_le(&w, 0, 2); /* needed */
		flx_pk_le(&w, s ? 0x0808 : 0x0800, 2);
		flx_pk_le(&w, 0, 2);
		flx_pk_le(&w, 0, 4);
		flx_pk_le(&w, rec_crc(f, r), 4);
		flx_pk_le(&w, s < ZIP_MAX32 ? s : ZIP_MAX32, 4);
		flx_pk_le(&w, s < ZIP_MAX32 ? s : ZIP_MAX32, 4);
		flx_pk_le(&w, l, 2);
		flx_pk_le(&w, z, 2);
		flx_pk_le(&w, 0, 2); /* comment */
		flx_pk_le(&w, 0, 2); /* disk */
		flx_pk_le(&w, 0, 2); /* internal attributes */
		flx_pk_le(&w, 0, 4); /* external attributes */
		flx_pk_le(&w, h < ZIP_MAX32 ? h : ZIP_MAX32, 4);
		flx_jw_raw(&w, name, l);
		if (!z)
			continue;
		flx_pk_le(&w, 1, 2);
		flx_pk_le(&w, z - 4, 2);
		if (s >= ZIP_MAX32) {
			flx_pk_le(&w, s, 8);
			flx_pk_le(&w, s, 8);
		}
		if (h >= ZIP_MAX32)
			flx_pk_le(&w, h, 8);
	}
	return flx_jw_end(&w, len);
}

/* ZIP64 end record, its locator, the end record. */
static int pt_end(const void *arg, uint32_t idx, unsigned char *dst,
		  uint64_t lo, uint64_t hi, uint64_t *len)
{
	const pt_file *f = arg;
	flx_jw w = flx_jw_window(dst, lo, hi);
	uint64_t n = nrec(f), cd = f->h[n], e64 = cd + f->cdlen;

	(void)idx;
	flx_pk_le(&w, 0x06064b50, 4);
	flx_pk_le(&w, 44, 8);
	flx_pk_le(&w, 0x031E, 2);
	flx_pk_le(&w, 0x002D, 2);
	flx_pk_le(&w, 0, 4);
	flx_pk_le(&w, 0, 4);
	flx_pk_le(&w, n, 8);
	flx_pk_le(&w, n, 8);
	flx_pk_le(&w, f->cdlen, 8);
	flx_pk_le(&w, cd, 8);
	flx_pk_le(&w, 0x07064b50, 4);
	flx_pk_le(&w, 0, 4);
	flx_pk_le(&w, e64, 8);
	flx_pk_le(&w, 1, 4);
	flx_pk_le(&w, 0x06054b50, 4);
	flx_pk_le(&w, 0, 2);
	flx_pk_le(&w, 0, 2);
	flx_pk_le(&w, n < 0xFFFF ? n : 0xFFFF, 2);
	flx_pk_le(&w, n < 0xFFFF ? n : 0xFFFF, 2);
	flx_pk_le(&w, f->cdlen < ZIP_MAX32 ? f->cdlen : ZIP_MAX32, 4);
	flx_pk_le(&w, cd < ZIP_MAX32 ? cd : ZIP_MAX32, 4);
	flx_pk_le(&w, 0, 2);
	return flx_jw_end(&w, len);
}

static const flx_gen_ops pk_head_ops = {"torch.save pickle head", pk_head};
static const flx_gen_ops pk_items_ops = {"torch.save pickle items", pk_items};
static const flx_gen_ops pk_tail_ops = {"torch.save pickle tail", pk_tail};
static const flx_gen_ops pt_head_ops = {"torch.save head", pt_head};
static const flx_gen_ops pt_after_pkl_ops = {"torch.save after data.pkl",
					     pt_after_pkl};
static const flx_gen_ops pt_between_ops = {"torch.save between tensors",
					   pt_between};
static const flx_gen_ops pt_cd_ops = {"torch.save central directory", pt_cd};
static const flx_gen_ops pt_end_ops = {"torch.save end", pt_end};

/* A zero run of a tensor of parts (arg: the flx_pt_part). */
static int pt_zeros(const void *arg, uint32_t idx, unsigned char *dst,
		    uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_pt_part *p = arg;
	uint64_t n = p->zeros;

	(void)idx;
	if (lo < hi && lo < n)
		memset(dst, 0, (hi < n ? hi : n) - lo);
	*len = n;
	return 0;
}

static const flx_gen_ops pt_zeros_ops = {"torch.save zero run", pt_zeros};

int flx_pt_set_new(flx_fs *fs, size_t n, flx_pt_set **out)
{
	flx_pt_set *s = flx_fs_alloc(fs, sizeof(*s) + n * sizeof(flx_pt_entry));

	if (!s)
		return -ENOMEM;
	s->e = (flx_pt_entry *)(s + 1);
	*out = s;
	return 0;
}

/* Piece (ops, f, idx): its length, and crc continued over its bytes. */
static int piece_crc(const flx_gen_ops *ops, const pt_file *f, uint32_t idx,
		     uint64_t *len, uint32_t *crc)
{
	unsigned char *buf;
	int rc = ops->gen(f, idx, NULL, 0, 0, len);

	if (rc || !*len)
		return rc;
	buf = malloc(*len);
	if (!buf)
		return -ENOMEM;
	rc = ops->gen(f, idx, buf, 0, *len, len);
	if (!rc)
		*crc = flx_crc32(*crc, buf, *len);
	free(buf);
	return rc;
}

/* data.pkl's length and CRC, then every record's offset (4.3). */
static int pt_layout(pt_file *f)
{
	uint64_t len, h = 0;
	uint32_t crc = 0;
	int rc = piece_crc(&pk_head_ops, f, 0, &len, &crc);

	f->pkl = len;
	for (size_t k = 0; !rc && k < f->set->n; k += FLX_GEN_BATCH) {
		rc = piece_crc(&pk_items_ops, f, (uint32_t)k, &len, &crc);
		f->pkl += len;
	}
	if (!rc)
		rc = piece_crc(&pk_tail_ops, f, 0, &len, &crc);
	if (rc)
		return rc;
	f->pkl += len;
	f->crc = crc;
	f->cdlen = 0;
	for (size_t r = 0; r < nrec(f); r++) {
		char name[PT_NAME_MAX + 1];
		size_t l = rec_name(f, r, name);
		uint64_t s = rec_size(f, r), z = zip64_len(s, h);

		f->h[r] = h;
		h += 30 + l + z + 4 + fb_pad(h, l, z) + s + desc_len(s, h);
		f->cdlen += 46 + l + z;
	}
	f->h[nrec(f)] = h;
	return 0;
}

/* The bytes of entry i's tensor: its view, or its parts. */
static int add_tensor(flx_fs *fs, int file, const pt_file *f, size_t i)
{
	const flx_pt_tensor *t = f->set->e[i].t;
	int rc = 0;

	if (pt_view(f, i))
		return flx_fs_add_view(fs, file, pt_view(f, i), NULL);
	for (size_t k = 0; !rc && k < t->nparts; k++) {
		const flx_pt_part *p = &t->parts[k];

		if (p->view)
			rc = flx_fs_add_view(fs, file, p->view, NULL);
		else if (p->file)
			rc = flx_fs_add_raw(fs, file, p->file, p->off, p->len);
		else
			rc = flx_fs_add_gen(fs, file, &pt_zeros_ops, p, 0);
	}
	return rc;
}

/* The pieces in file order, then a check that they add up to the
 * layout (-EIO: they do not, a bug). */
int flx_pt_add_file(flx_fs *fs, int dir, const char *name,
		    const flx_pt_set *set, int tp)
{
	pt_file *f = flx_fs_alloc(fs, sizeof(*f));
	int file, rc = -ENOMEM;

	if (!f)
		goto out;
	*f = (pt_file){.set = set, .tp = tp};
	f->h = flx_fs_alloc(fs, (set->n + 4) * sizeof(uint64_t));
	if (!f->h)
		goto out;
	rc = -EINVAL;
	for (size_t k = 0; k < set->n; k++)
		if (!flx_pk_utf8_ok(set->e[k].name))
			goto out;
	rc = -ENOMEM;
	f->key = flx_fs_alloc(fs, (set->n + 1) * sizeof(uint32_t));
	f->ent = flx_fs_alloc(fs, (set->n + 1) * sizeof(uint32_t));
	if (!f->key || !f->ent)
		goto out;
	for (size_t k = 0; k < set->n; k++)
		if (has_tensor(&set->e[k])) {
			f->key[k] = (uint32_t)f->ns;
			f->ent[f->ns++] = (uint32_t)k;
		}
	rc = pt_layout(f);
	if (!rc)
		rc = flx_fs_mkfile(fs, dir, name, &file);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pt_head_ops, f, 0);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pk_head_ops, f, 0);
	for (size_t k = 0; !rc && k < set->n; k += FLX_GEN_BATCH)
		rc = flx_fs_add_gen(fs, file, &pk_items_ops, f, (uint32_t)k);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pk_tail_ops, f, 0);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pt_after_pkl_ops, f, 0);
	for (size_t k = 0; !rc && k < f->ns; k++) {
		rc = add_tensor(fs, file, f, f->ent[k]);
		if (!rc)
			rc = flx_fs_add_gen(fs, file, &pt_between_ops, f,
					    (uint32_t)k);
	}
	for (size_t r = 0; !rc && r < nrec(f); r += FLX_GEN_BATCH)
		rc = flx_fs_add_gen(fs, file, &pt_cd_ops, f, (uint32_t)r);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &pt_end_ops, f, 0);
	if (!rc && flx_fs_file_size(fs, file) !=
		       f->h[nrec(f)] + f->cdlen + 56 + 20 + 22)
		rc = -EIO;
out:
	return rc;
}
