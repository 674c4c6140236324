/* SPDX-License-Identifier: MIT */
/* The format x dtype table; see compat.h.  The rows are the writers'. */
#include "compat.h"

#include "paddle/paddle.h"

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

/* Each name of exclude_dtypes= (a ':'-separated list) is a dtype. */
static int check_dtypes(const flx_opt *o, const char *value, uint64_t *num,
			flx_error *err)
{
	const char *p = value ? value : "";
	char name[32];

	(void)num;
	for (;;) {
		size_t len = strcspn(p, ":");
		flx_dtype dt = FLX_DT_INVALID;

		if (len > 0 && len < sizeof(name)) {
			memcpy(name, p, len);
			name[len] = '\0';
			dt = flx_dtype_from_name(name);
		}
		if (dt == FLX_DT_INVALID)
			return flx_error_set(
			    err, -EINVAL, NULL, o->name,
			    "'%.*s' is no dtype (names as index.json prints "
			    "them, complex64, or as safetensors does, C64)",
			    (int)(len < 64 ? len : 64), p);
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

static const flx_opt fmt_opts[] = {
    {.name = "new_dtypes",
     .type = FLX_OPT_FLAG,
     .help = "keep the tensors only newer readers of a file's format hold "
	     "(complex64 in safetensors: 0.7; uint16/32/64 and float8 in "
	     "model.pt and megatron/: torch 2.3, 2.1), left out by "
	     "default"},
    {.name = "exclude_dtypes",
     .type = FLX_OPT_GLOBS,
     .metavar = "DT:DT",
     .help = "leave the tensors of these dtypes (complex64 or C64, as "
	     "index.json or safetensors name them) out of every file",
     .check = check_dtypes},
};

const flx_opt_group flx_fmt_opt_group = {
    .owner = "formats",
    .title = "File formats (which dtypes the files hold)",
    .opts = fmt_opts,
    .nopts = FLX_OPT_COUNT(fmt_opts),
};

/* Whether exclude_dtypes= of s names dt. */
static bool excluded(const flx_spec *s, flx_dtype dt)
{
	char *const *list;
	size_t n;

	if (flx_opt_list(&s->opts, "exclude_dtypes", &list, &n))
		return false;
	for (size_t i = 0; i < n; i++)
		if (flx_dtype_from_name(list[i]) == dt)
			return true;
	return false;
}

const char *flx_fmt_left_out(const flx_spec *s, flx_fmt f, flx_dtype dt)
{
	const flx_fmt_dtypes *r = flx_fmt_row(f);
	bool newer = false;

	if ((unsigned)dt >= FLX_DT_COUNT)
		return "no such dtype";
	if (excluded(s, dt))
		return "exclude_dtypes=";
	if (r->never[dt])
		return r->never[dt];
	(void)flx_opt_flag(&s->opts, "new_dtypes", &newer);
	return newer ? NULL : r->older[dt];
}

/* -o mindspore[=0|1], or dst_strategy= (which sets it) given later */
static bool ms_asked(const flx_spec *s)
{
	bool on = false;

	if (flx_opt_order(&s->opts, "dst_strategy") >
	    flx_opt_order(&s->opts, "mindspore"))
		return true;
	(void)flx_opt_flag(&s->opts, "mindspore", &on);
	return on;
}

bool flx_fmt_served(const flx_plan *p, flx_fmt f)
{
	const flx_ckpt *c = p->ckpt;

	switch (f) {
	case FLX_FMT_PDPARAMS:
		return c && flx_paddle_of(c);
	case FLX_FMT_MSCKPT:
		return ms_asked(p->spec) ||
		       (c && c->format && !strncmp(c->format, "mindspore", 9));
	default:
		return (unsigned)f < FLX_FMT_CORE;
	}
}

bool flx_fmt_any_left_out(const flx_plan *p, flx_dtype dt)
{
	if (excluded(p->spec, dt))
		return false;
	for (int f = 0; f < FLX_FMT_COUNT; f++)
		if (flx_fmt_served(p, (flx_fmt)f) &&
		    flx_fmt_left_out(p->spec, (flx_fmt)f, dt))
			return true;
	return false;
}

/* The served formats leaving out dt, "safetensors, torch.save", into
 * buf. */
static void formats_of(const flx_plan *p, flx_dtype dt, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int f = 0; f < FLX_FMT_COUNT; f++)
		if (flx_fmt_served(p, (flx_fmt)f) &&
		    flx_fmt_left_out(p->spec, (flx_fmt)f, dt) && n < len)
			n += (size_t)snprintf(buf + n, len - n, "%s%s",
					      n ? ", " : "",
					      flx_fmt_row((flx_fmt)f)->name);
}

int flx_fmt_note(const flx_plan *p, char *buf, size_t len)
{
	const flx_spec *s = p->spec;
	char list[240], fmts[64], name[80];
	size_t count = 0, n = 0, shown = 0;
	bool older = false, newer = false;

	list[0] = '\0';
	(void)flx_opt_flag(&s->opts, "new_dtypes", &newer);
	for (size_t i = 0; i < p->n; i++) {
		const flx_tensor *t = p->p[i].src;

		if (!flx_fmt_any_left_out(p, t->dtype))
			continue;
		for (int f = 0; f < FLX_FMT_COUNT && !newer; f++)
			older |= flx_fmt_served(p, (flx_fmt)f) &&
				 flx_fmt_row((flx_fmt)f)->older[t->dtype] &&
				 !flx_fmt_row((flx_fmt)f)->never[t->dtype];
		if (count++ >= 3)
			continue;
		formats_of(p, t->dtype, fmts, sizeof(fmts));
		/* one printable line, as error lines are (cut if long) */
		(void)flx_escape(t->fqn, false, name, sizeof(name));
		if (n < sizeof(list))
			n += (size_t)snprintf(list + n, sizeof(list) - n,
					      "%s%s (%s: not in %s)",
					      shown ? ", " : "", name,
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
