/* SPDX-License-Identifier: MIT */
/* Literal bytes of the synthetic file formats (target-formats.md). */
#include "tree_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_entry(const void *pa, const void *pb)
{
	const flx_st_entry *a = pa, *b = pb;
	unsigned ea = flx_dtype_size(flx_view_tensor(a->view)->dtype);
	unsigned eb = flx_dtype_size(flx_view_tensor(b->view)->dtype);

	if (ea != eb)
		return ea > eb ? -1 : 1;
	return strcmp(a->name, b->name);
}

json_t *flx_json_ints(int n, const int64_t *v)
{
	json_t *a = json_array();

	for (int i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_integer(v[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

int flx_safetensors_header(flx_st_entry *e, size_t n, json_t *metadata,
			   unsigned char **out, uint64_t *len)
{
	json_t *root = json_object(), *meta;
	uint64_t off = 0, hlen, total;
	unsigned char *buf = NULL;
	char *text = NULL;
	size_t tlen;
	int rc = -ENOMEM;

	if (!root)
		return -ENOMEM;
	meta = metadata ? json_incref(metadata)
			: json_pack("{s:s}", "format", "pt");
	if (!meta || json_object_set_new(root, "__metadata__", meta))
		goto out;
	qsort(e, n, sizeof(*e), cmp_entry);
	for (size_t i = 0; i < n; i++) {
		const flx_tensor *t = flx_view_tensor(e[i].view);
		const char *dt = flx_dtype_get(t->dtype)->safetensors;
		uint64_t b = flx_view_bytes(e[i].view);
		json_t *o;

		if (!dt) {
			rc = -EINVAL;
			goto out;
		}
		o = json_pack(
		    "{s:s,s:o,s:[I,I]}", "dtype", dt, "shape",
		    flx_json_ints(t->ndim, flx_view_box(e[i].view)->size),
		    "data_offsets", (json_int_t)off, (json_int_t)(off + b));
		if (!o || json_object_set_new(root, e[i].name, o))
			goto out;
		off += b;
	}
	text = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
	if (!text)
		goto out;
	tlen = strlen(text);
	/* pad with spaces so that the data starts 64-byte aligned */
	total = (8 + tlen + 63) & ~(uint64_t)63;
	hlen = total - 8;
	buf = malloc(total);
	if (!buf)
		goto out;
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)(hlen >> (8 * i));
	memcpy(buf + 8, text, tlen);
	memset(buf + 8 + tlen, ' ', total - 8 - tlen);
	*out = buf;
	*len = total;
	rc = 0;
out:
	free(text);
	json_decref(root);
	return rc;
}

int flx_npy_header(flx_dtype dt, int ndim, const int64_t *shape,
		   unsigned char **out, uint64_t *len)
{
	char dict[64 + 24 * FLX_MAX_DIMS];
	size_t n, pre, total;
	unsigned char *buf;
	bool v2;

	n = (size_t)snprintf(dict, sizeof(dict),
			     "{'descr': '%s', 'fortran_order': False, "
			     "'shape': (",
			     flx_dtype_get(dt)->npy);
	for (int d = 0; d < ndim; d++)
		n += (size_t)snprintf(dict + n, sizeof(dict) - n, "%lld, ",
				      (long long)shape[d]);
	if (ndim >= 1) /* "(5,)" for 1-d; "(2, 3)" for more; "()" for 0-d */
		n -= ndim == 1 ? 1 : 2;
	n += (size_t)snprintf(dict + n, sizeof(dict) - n, "), }");
	v2 = n + 1 + 10 > 65535;
	pre = v2 ? 12 : 10;
	total = (pre + n + 1 + 63) & ~(size_t)63;
	buf = malloc(total);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = v2 ? 2 : 1;
	buf[7] = 0;
	for (size_t i = 0; i < pre - 8; i++)
		buf[8 + i] = (unsigned char)((total - pre) >> (8 * i));
	memcpy(buf + pre, dict, n);
	memset(buf + pre + n, ' ', total - pre - n - 1);
	buf[total - 1] = '\n';
	*out = buf;
	*len = total;
	return 0;
}

int flx_file_name(const char *fqn, const char *suffix, char **out)
{
	size_t n = 0, cap = strlen(fqn) * 3 + strlen(suffix) + 8;
	char *s = malloc(cap);

	if (!s)
		return -ENOMEM;
	if (!strcmp(fqn, ".") || !strcmp(fqn, "..")) {
		n += (size_t)sprintf(s, "%%2E");
		fqn++;
	}
	for (; *fqn; fqn++) {
		if (*fqn == '/' || *fqn == '%')
			n += (size_t)sprintf(s + n, "%%%02X",
					     (unsigned char)*fqn);
		else
			s[n++] = *fqn;
	}
	strcpy(s + n, suffix);
	if (strlen(s) > 255) {
		free(s);
		return -ENAMETOOLONG;
	}
	*out = s;
	return 0;
}
