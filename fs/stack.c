/* SPDX-License-Identifier: MIT */
#include "stack.h"

#include <string.h>

int flx_stack_build(const char *source, const char *format,
		    const flx_spec *spec, flx_stack *s, flx_error *err)
{
	const flx_ckpt_opts o = {.format = format, .defer_items = true};
	flx_error ierr;
	int rc, irc;

	memset(s, 0, sizeof(*s));
	rc = flx_ckpt_open_with(source, &o, &s->ckpt, err);
	if (!rc)
		rc = flx_xform_apply(spec->xform, s->ckpt, &s->xi, err);
	if (!rc)
		rc =
		    flx_plan_build(flx_xindex_ckpt(s->xi), spec, &s->plan, err);
	if (!rc)
		rc = flx_fs_build(flx_xindex_ckpt(s->xi), s->plan, &s->fs, err);
	if (s->ckpt) {
		/* a bad item first, as when the items were read first */
		flx_error_init(&ierr);
		irc = flx_ckpt_finish(s->ckpt, &ierr);
		if (irc) {
			if (err)
				*err = ierr;
			rc = irc;
		} else if (s->xi) {
			flx_xindex_finish(s->xi);
		}
	}
	if (rc) {
		if (err && !err->code)
			flx_error_set(err, rc, source, NULL, "%s",
				      strerror(-rc));
		flx_stack_free(s);
	}
	return rc;
}

void flx_stack_free(flx_stack *s)
{
	flx_fs_free(s->fs);
	flx_plan_free(s->plan);
	flx_xindex_free(s->xi);
	flx_ckpt_close(s->ckpt);
	memset(s, 0, sizeof(*s));
}
