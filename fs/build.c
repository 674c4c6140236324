/* SPDX-License-Identifier: MIT */
/*
 * The builder: checks what every generated file will hold, then runs the
 * layouts (layout.h) to fill the tree, then seals it.
 */
#include "layout.h"

#include "formats/json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int flx_build_fail(flx_build *b, int rc, const char *key, const char *what)
{
	if (rc == -ENOMEM)
		return flx_error_set(b->err, rc, NULL, key, "out of memory");
	return flx_error_set(b->err, rc, NULL, key, "%s: %s", what,
			     strerror(-rc));
}

const flx_layout *flx_build_layout(const flx_build *b, const char *name)
{
	for (size_t i = 0; i < b->nlayouts; i++)
		if (!strcmp(b->layouts[i]->name, name))
			return b->layouts[i];
	return NULL;
}

static int not_utf8(flx_build *b, const char *what, const char *s)
{
	if (!s || flx_utf8_valid(s))
		return 0;
	return flx_error_set(b->err, -EINVAL, NULL, what,
			     "not valid UTF-8: cannot be written in JSON "
			     "(index.json, safetensors headers)");
}

/* JSON carries only UTF-8: every string the generated files hold is
 * checked before any is measured, so that a read never meets one. */
static int check_strings(flx_build *b)
{
	const flx_ckpt *c = b->ckpt;
	const flx_spec *s = b->plan->spec;
	int rc = not_utf8(b, "dir", c->dir);

	if (!rc)
		rc = not_utf8(b, "format", c->format);
	if (!rc)
		rc = not_utf8(b, "writer", c->writer);
	if (!rc)
		rc = not_utf8(b, "rules", s->rules_path);
	if (!rc)
		rc = not_utf8(b, "layer_regex", s->layer_regex);
	if (!rc)
		rc = not_utf8(b, "embed_regex", s->embed_regex);
	for (size_t i = 0; !rc && i < c->ntensors; i++)
		rc = not_utf8(b, c->tensors[i].fqn, c->tensors[i].fqn);
	for (size_t i = 0; !rc && i < c->nobjects; i++) {
		const flx_object *o = &c->objects[i];

		rc = not_utf8(b, o->fqn, o->fqn);
		if (!rc)
			rc = not_utf8(b, o->fqn, c->files[o->file].relpath);
	}
	return rc;
}

/* What the generators share, owned by the fs. */
static int gen_ctx(flx_build *b)
{
	const flx_ckpt *c = b->ckpt;
	flx_gen_ctx *x = flx_fs_alloc(b->fs, sizeof(*x));

	if (!x)
		return flx_build_fail(b, -ENOMEM, "index.json", "");
	x->plan = b->plan;
	x->plain_names = true;
	for (size_t i = 0; i < c->ntensors && x->plain_names; i++)
		x->plain_names = flx_json_plain(c->tensors[i].fqn);
	b->gen = x;
	return 0;
}

/*
 * Every layout's size(), then one allocation of the tree's arrays, then
 * every layout's build(), in table order.
 */
static int run_layouts(flx_build *b)
{
	void **state = calloc(b->nlayouts ? b->nlayouts : 1, sizeof(*state));
	flx_fs_size sz = {.nodes = 1, .names = 1};
	int rc = state ? 0 : flx_build_fail(b, -ENOMEM, NULL, "");

	for (size_t i = 0; !rc && i < b->nlayouts; i++)
		if (b->layouts[i]->size)
			rc = b->layouts[i]->size(b, &state[i], &sz);
	if (!rc && flx_fs_reserve(b->fs, &sz))
		rc = flx_build_fail(b, -ENOMEM, NULL, "");
	for (size_t i = 0; !rc && i < b->nlayouts; i++)
		rc = b->layouts[i]->build(b, state[i]);
	free(state);
	return rc;
}

int flx_fs_build_with(const flx_ckpt *ckpt, const flx_plan *plan,
		      const flx_layout *const *table, size_t n, flx_fs **out,
		      flx_error *err)
{
	flx_build b = {.ckpt = ckpt,
		       .plan = plan,
		       .err = err,
		       .layouts = table,
		       .nlayouts = n};
	const char *dup = NULL;
	int rc = flx_fs_new(ckpt, &b.fs);

	if (rc) {
		flx_build_fail(&b, rc, NULL, "");
		goto out;
	}
	/* generated pieces name their tensor or object by a 32-bit index */
	if (plan->n > UINT32_MAX || ckpt->nobjects > UINT32_MAX)
		rc = flx_build_fail(&b, -EFBIG, "index.json",
				    "too many tensors");
	if (!rc)
		rc = check_strings(&b);
	if (!rc)
		rc = gen_ctx(&b);
	if (!rc)
		rc = run_layouts(&b);
	if (!rc && (rc = flx_fs_finish(b.fs, &dup)))
		flx_error_set(err, rc, NULL, dup,
			      rc == -EEXIST ? "two entries of one directory "
					      "share this name"
					    : "out of memory");
out:
	if (rc) {
		flx_error_default(err, rc, NULL);
		flx_fs_free(b.fs);
		return rc;
	}
	*out = b.fs;
	return 0;
}

int flx_fs_build(const flx_ckpt *ckpt, const flx_plan *plan, flx_fs **out,
		 flx_error *err)
{
	return flx_fs_build_with(ckpt, plan, flx_layouts, flx_nlayouts, out,
				 err);
}
