/* SPDX-License-Identifier: MIT */
/* The format x dtype table; see compat.h.  The rows are the writers'. */
#include "compat.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const flx_fmt_dtypes *const rows[FLX_FMT_COUNT] = {
    [FLX_FMT_SAFETENSORS] = &flx_st_dtypes,
    [FLX_FMT_TORCHSAVE] = &flx_pt_dtypes,
    [FLX_FMT_NPY] = &flx_npy_dtypes,
    [FLX_FMT_PDPARAMS] = &flx_pd_dtypes,
    [FLX_FMT_MSCKPT] = &flx_ms_dtypes,
};

const flx_fmt_dtypes *flx_fmt_row(flx_fmt f)
{
	return rows[(unsigned)f < FLX_FMT_COUNT ? f : 0];
}

const char *flx_fmt_left_out(const flx_spec *s, flx_fmt f, flx_dtype dt)
{
	const flx_fmt_dtypes *r = flx_fmt_row(f);

	if ((unsigned)dt >= FLX_DT_COUNT)
		return "no such dtype";
	if (s->exclude_dtypes & (1u << dt))
		return "exclude_dtypes=";
	if (r->never[dt])
		return r->never[dt];
	return s->new_dtypes ? NULL : r->older[dt];
}

bool flx_fmt_any_left_out(const flx_spec *s, flx_dtype dt)
{
	if ((unsigned)dt < FLX_DT_COUNT && (s->exclude_dtypes & (1u << dt)))
		return false;
	for (int f = 0; f < FLX_FMT_CORE; f++)
		if (flx_fmt_left_out(s, (flx_fmt)f, dt))
			return true;
	return false;
}

/* The core formats leaving out dt, "safetensors, torch.save", into buf. */
static void formats_of(const flx_spec *s, flx_dtype dt, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int f = 0; f < FLX_FMT_CORE; f++)
		if (flx_fmt_left_out(s, (flx_fmt)f, dt) && n < len)
			n += (size_t)snprintf(buf + n, len - n, "%s%s",
					      n ? ", " : "",
					      flx_fmt_row((flx_fmt)f)->name);
}

int flx_fmt_note(const flx_plan *p, char *buf, size_t len)
{
	const flx_spec *s = p->spec;
	char list[240], fmts[64];
	size_t count = 0, n = 0, shown = 0;
	bool older = false;

	list[0] = '\0';
	for (size_t i = 0; i < p->n; i++) {
		const flx_tensor *t = p->p[i].src;

		if (!flx_fmt_any_left_out(s, t->dtype))
			continue;
		for (int f = 0; f < FLX_FMT_CORE && !s->new_dtypes; f++)
			older |= flx_fmt_row((flx_fmt)f)->older[t->dtype] &&
				 !flx_fmt_row((flx_fmt)f)->never[t->dtype];
		if (count++ >= 3)
			continue;
		formats_of(s, t->dtype, fmts, sizeof(fmts));
		if (n < sizeof(list))
			n += (size_t)snprintf(list + n, sizeof(list) - n,
					      "%s%s (%s: not in %s)",
					      shown ? ", " : "", t->fqn,
					      flx_dtype_name(t->dtype), fmts);
		shown++;
	}
	if (!count)
		return -ENOENT;
	snprintf(buf, len,
		 "%zu tensor(s) left out of the files whose readers cannot "
		 "all hold their dtype (still in the other formats; "
		 "index.json \"left_out\" says why): %s%s%s",
		 count, list, count > shown ? ", ..." : "",
		 older ? "; new_dtypes=1 keeps those newer readers hold" : "");
	return 0;
}
