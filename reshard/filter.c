/* SPDX-License-Identifier: MIT */
/*
 * include= / exclude= / strip_prefix= (filter.h): copies of the kept
 * records, renamed, and a name index of them.
 */
#include "filter.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

struct flx_findex {
	const flx_ckpt *src; /* when nothing is filtered */
	flx_ckpt c;	     /* otherwise: the filtered index */
	bool own;
};

static bool any_match(char *const *globs, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (fnmatch(globs[i], name, 0) == 0)
			return true;
	return false;
}

/* Whether name (as the index has it) is served. */
static bool kept(const flx_spec *s, const char *name)
{
	return (!s->ninclude || any_match(s->include, s->ninclude, name)) &&
	       !any_match(s->exclude, s->nexclude, name);
}

/* name less the prefix, when it starts with it and keeps a character. */
static const char *stripped(const flx_spec *s, const char *name)
{
	size_t n = s->strip_prefix ? strlen(s->strip_prefix) : 0;

	if (n && strncmp(name, s->strip_prefix, n) == 0 && name[n])
		return name + n;
	return name;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp((*(flx_tensor *const *)a)->fqn,
		      (*(flx_tensor *const *)b)->fqn);
}

static int cmp_object_name(const void *a, const void *b)
{
	return strcmp(((const flx_object *)a)->fqn,
		      ((const flx_object *)b)->fqn);
}

/* The first name two records share after the cut, or NULL. */
static const char *repeated_object(flx_object *o, size_t n)
{
	flx_object *v = malloc((n ? n : 1) * sizeof(*v));
	const char *dup = NULL;

	if (!v)
		return NULL;
	memcpy(v, o, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp_object_name);
	for (size_t i = 1; i < n && !dup; i++)
		if (!strcmp(v[i - 1].fqn, v[i].fqn))
			dup = v[i].fqn;
	free(v);
	return dup;
}

int flx_filter_apply(const flx_spec *spec, const flx_ckpt *src,
		     flx_findex **out, flx_error *err)
{
	flx_findex *fi = calloc(1, sizeof(*fi));
	flx_ckpt *c;
	const char *dup = NULL;
	int rc = 0;

	if (!fi)
		return flx_error_default(err, -ENOMEM, NULL);
	fi->src = src;
	if (!spec->ninclude && !spec->nexclude && !spec->strip_prefix) {
		*out = fi;
		return 0;
	}
	fi->own = true;
	c = &fi->c;
	*c = *src; /* files, dir, format, common state: borrowed */
	c->pooled = false;
	c->loading = NULL;
	c->tensors =
	    malloc((src->ntensors ? src->ntensors : 1) * sizeof(*c->tensors));
	c->by_name =
	    malloc((src->ntensors ? src->ntensors : 1) * sizeof(*c->by_name));
	c->objects =
	    malloc((src->nobjects ? src->nobjects : 1) * sizeof(*c->objects));
	if (!c->tensors || !c->by_name || !c->objects) {
		rc = -ENOMEM;
		goto out;
	}
	c->ntensors = c->nobjects = 0;
	for (size_t i = 0; i < src->ntensors; i++) {
		if (!kept(spec, src->tensors[i].fqn))
			continue;
		c->tensors[c->ntensors] = src->tensors[i];
		c->tensors[c->ntensors].fqn =
		    (char *)stripped(spec, src->tensors[i].fqn);
		c->by_name[c->ntensors] = &c->tensors[c->ntensors];
		c->ntensors++;
	}
	for (size_t i = 0; i < src->nobjects; i++) {
		if (!kept(spec, src->objects[i].fqn))
			continue;
		c->objects[c->nobjects] = src->objects[i];
		c->objects[c->nobjects].fqn =
		    (char *)stripped(spec, src->objects[i].fqn);
		c->nobjects++;
	}
	if (!c->ntensors) {
		rc = flx_error_set(err, -EINVAL, NULL, "include",
				   "no tensor passes include= and exclude= "
				   "(of %zu)",
				   src->ntensors);
		goto out;
	}
	qsort(c->by_name, c->ntensors, sizeof(*c->by_name), cmp_tensor_name);
	for (size_t i = 1; i < c->ntensors && !dup; i++)
		if (!strcmp(c->by_name[i - 1]->fqn, c->by_name[i]->fqn))
			dup = c->by_name[i]->fqn;
	if (!dup)
		dup = repeated_object(c->objects, c->nobjects);
	if (dup)
		rc = flx_error_set(err, -EINVAL, NULL, "strip_prefix",
				   "'%s' names two tensors or objects once "
				   "'%s' is cut",
				   dup, spec->strip_prefix);
out:
	if (rc) {
		flx_findex_free(fi);
		return flx_error_default(err, rc, NULL);
	}
	*out = fi;
	return 0;
}

const flx_ckpt *flx_findex_ckpt(const flx_findex *fi)
{
	return fi->own ? &fi->c : fi->src;
}

void flx_findex_free(flx_findex *fi)
{
	if (!fi)
		return;
	if (fi->own) {
		free(fi->c.tensors);
		free(fi->c.by_name);
		free(fi->c.objects);
	}
	free(fi);
}
