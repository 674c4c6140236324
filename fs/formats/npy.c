/* SPDX-License-Identifier: MIT */
/* .npy files; see npy.h.  The header is what numpy.save() writes. */
#include "npy.h"

#include "json_internal.h"
#include "compat.h"
#include "names.h"

#include <errno.h>
#include <string.h>

/* Every descr flx_dtype_info.npy names is a numpy type of numpy 1.24 and
 * 2.x (bfloat16 and float8 as their bits): np.load reads them all.
 * docs/formats/npy.md */
const flx_fmt_dtypes flx_npy_dtypes = {.name = "npy"};

/* The header of view arg, as one piece. */
static int npy_header(const void *arg, uint32_t idx, unsigned char *dst,
		      uint64_t lo, uint64_t hi, uint64_t *len)
{
	static const char head[] = "{'descr': '";
	static const char mid[] = "', 'fortran_order': False, 'shape': (";
	const flx_view *v = arg;
	const flx_tensor *t = flx_view_tensor(v);
	const int64_t *shape = flx_view_box(v)->size;
	const char *descr = flx_dtype_get(t->dtype)->npy;
	size_t dl = strlen(descr);
	char dict[sizeof(head) + sizeof(mid) + 32 + 24 * FLX_MAX_DIMS];
	unsigned char pre[12];
	size_t n = 0, npre, total;
	flx_jw w = flx_jw_window(dst, lo, hi);
	bool v2;

	(void)idx;
	if (dl > 32)
		return -EINVAL;
	memcpy(dict, head, sizeof(head) - 1);
	n += sizeof(head) - 1;
	memcpy(dict + n, descr, dl);
	n += dl;
	memcpy(dict + n, mid, sizeof(mid) - 1);
	n += sizeof(mid) - 1;
	/* "(5,)" for 1-d; "(2, 3)" for more; "()" for 0-d */
	for (int d = 0; d < t->ndim; d++) {
		if (d) {
			memcpy(dict + n, ", ", 2);
			n += 2;
		}
		n += flx_fmt_int(dict + n, shape[d], 1);
	}
	if (t->ndim == 1)
		dict[n++] = ',';
	memcpy(dict + n, "), }", 4);
	n += 4;
	/* the prefix, the dict and its newline, padded to 64 */
	v2 = n + 1 + 10 > 65535;
	npre = v2 ? 12 : 10;
	total = (npre + n + 1 + 63) & ~(size_t)63;
	memcpy(pre, "\x93NUMPY", 6);
	pre[6] = v2 ? 2 : 1;
	pre[7] = 0;
	for (size_t i = 0; i < npre - 8; i++)
		pre[8 + i] = (unsigned char)((total - npre) >> (8 * i));
	flx_jw_raw(&w, pre, npre);
	flx_jw_raw(&w, dict, n);
	flx_jw_spaces(&w, total - 1 - npre - n);
	flx_jw_raw(&w, "\n", 1);
	return flx_jw_end(&w, len);
}

static const flx_gen_ops npy_header_ops = {".npy header", npy_header};

int flx_npy_add_file(flx_fs *fs, int dir, const char *name, int like,
		     const flx_view *v, int *node)
{
	int rc = like >= 0 ? flx_fs_mkfile_as(fs, dir, like, node)
			   : flx_fs_mkfile(fs, dir, name, node);

	return rc ? rc : flx_fs_add_view(fs, *node, v, &npy_header_ops);
}
