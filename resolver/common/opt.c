/* SPDX-License-Identifier: MIT */
#include "opt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void flx_opt_vals_init(flx_opt_vals *vals)
{
	vals->v = NULL;
	vals->n = 0;
}

static void val_free(flx_opt_val *v)
{
	free(v->text);
	for (size_t i = 0; i < v->nlist; i++)
		free(v->list[i]);
	free(v->list);
	memset(v, 0, sizeof(*v));
}

void flx_opt_vals_release(flx_opt_vals *vals)
{
	if (!vals)
		return;
	for (size_t i = 0; i < vals->n; i++)
		val_free(&vals->v[i]);
	free(vals->v);
	vals->v = NULL;
	vals->n = 0;
}

static const flx_opt_val *find(const flx_opt_vals *vals, const char *name)
{
	for (size_t i = 0; vals && i < vals->n; i++)
		if (!strcmp(vals->v[i].opt->name, name))
			return &vals->v[i];
	return NULL;
}

/* "a, b or c" into buf. */
static void choice_list(const flx_opt *o, char *buf, size_t cap)
{
	size_t n = 0, k = 0;

	buf[0] = '\0';
	while (o->choices && o->choices[k])
		k++;
	for (size_t i = 0; i < k && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, "%s%s",
				      i == 0	   ? ""
				      : i + 1 == k ? " or "
						   : ", ",
				      o->choices[i]);
}

/* The type's own parse of a number: UINT or SIZE in [min, max]. */
static int parse_num(const flx_opt *o, const char *value, uint64_t *num,
		     flx_error *err)
{
	uint64_t v = 0;
	bool ok;

	if (o->type == FLX_OPT_SIZE) {
		ok = (value && !strcmp(value, "0")) ||
		     !flx_parse_size(value, &v);
	} else {
		const char *p = value ? value : "";

		ok = *p && strlen(p) <= 19;
		for (; ok && *p; p++) {
			ok = *p >= '0' && *p <= '9';
			v = v * 10 + (uint64_t)(*p - '0');
		}
	}
	if (ok && (o->min || o->max))
		ok = v >= o->min && v <= o->max;
	if (!ok && o->type == FLX_OPT_SIZE)
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "expected a size such as 5G or 500M, "
				     "got '%s'",
				     value ? value : "");
	if (!ok)
		return flx_error_set(
		    err, -EINVAL, NULL, o->name,
		    "expected an integer from %llu to %llu, "
		    "got '%s'",
		    (unsigned long long)o->min,
		    (unsigned long long)(o->max ? o->max : UINT64_MAX),
		    value ? value : "");
	*num = v;
	return 0;
}

/* Append value's ':'-separated globs to v. */
static int add_globs(flx_opt_val *v, const char *key, const char *value,
		     flx_error *err)
{
	const char *p = value;

	if (!value || !*value)
		return flx_error_set(err, -EINVAL, NULL, key,
				     "expected globs separated by ':'");
	for (;;) {
		size_t len = strcspn(p, ":");
		char **nv;

		if (len == 0)
			return flx_error_set(err, -EINVAL, NULL, key,
					     "an empty glob in '%s'", value);
		nv = realloc(v->list, (v->nlist + 1) * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		v->list = nv;
		if (!(nv[v->nlist] = strndup(p, len)))
			return -ENOMEM;
		v->nlist++;
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

int flx_parse_path(const char *key, const char *value, char **out,
		   flx_error *err)
{
	char cwd[4096];

	*out = NULL;
	if (!value || !*value)
		return flx_error_set(err, -EINVAL, NULL, key,
				     "needs a path (%s=...)", key);
	if (value[0] == '/')
		*out = strdup(value);
	else if (!getcwd(cwd, sizeof(cwd)))
		return flx_error_set(err, -errno, NULL, key,
				     "a relative path, and no working "
				     "directory: %s",
				     strerror(errno));
	else if (asprintf(out, "%s/%s", cwd, value) < 0)
		*out = NULL;
	return *out ? 0
		    : flx_error_set(err, -ENOMEM, NULL, key, "out of memory");
}

/* Parse value into v (empty before). */
static int parse(const flx_opt *o, const char *value, flx_opt_val *v,
		 flx_error *err)
{
	bool flag = false;
	int rc;

	if (!value && o->type != FLX_OPT_FLAG && !(o->flags & FLX_OPT_BARE))
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "needs a value (%s=...)", o->name);
	if (o->check && o->type != FLX_OPT_FLAG) {
		rc = o->check(o, value, &v->num, err);
		if (rc)
			return rc;
	}
	switch (o->type) {
	case FLX_OPT_FLAG:
		rc = flx_parse_flag(o->name, value, &flag, err);
		if (!rc && o->check)
			rc = o->check(o, value, &v->num, err);
		v->num = flag;
		return rc;
	case FLX_OPT_UINT:
	case FLX_OPT_SIZE:
		return o->check ? 0 : parse_num(o, value, &v->num, err);
	case FLX_OPT_CHOICE:
		for (size_t i = 0; value && o->choices && o->choices[i]; i++)
			if (!strcmp(value, o->choices[i])) {
				v->num = i;
				v->text = strdup(value);
				return v->text ? 0 : -ENOMEM;
			}
		if (!o->check) {
			char list[FLX_ERR_FIELD];

			choice_list(o, list, sizeof(list));
			return flx_error_set(err, -EINVAL, NULL, o->name,
					     "expected %s, got '%s'", list,
					     value ? value : "");
		}
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "'%s' is not a choice", value);
	case FLX_OPT_PATH:
		return flx_parse_path(o->name, value, &v->text, err);
	case FLX_OPT_TEXT:
		if (!value || !*value)
			return flx_error_set(err, -EINVAL, NULL, o->name,
					     "needs a value (%s=...)", o->name);
		v->text = strdup(value);
		return v->text ? 0
			       : flx_error_set(err, -ENOMEM, NULL, o->name,
					       "out of memory");
	case FLX_OPT_GLOBS:
		return add_globs(v, o->name, value, err);
	}
	return -EINVAL;
}

int flx_opt_vals_set(flx_opt_vals *vals, const flx_opt *o, const char *value,
		     flx_error *err)
{
	flx_opt_val nv = {.opt = o}, *old = NULL;
	int rc;

	for (size_t i = 0; i < vals->n && !old; i++)
		if (vals->v[i].opt == o ||
		    !strcmp(vals->v[i].opt->name, o->name))
			old = &vals->v[i];
	if (old && o->type == FLX_OPT_GLOBS) {
		/* what was stored stays when a later glob is bad */
		size_t keep = old->nlist;

		rc = add_globs(old, o->name, value, err);
		if (rc) {
			while (old->nlist > keep)
				free(old->list[--old->nlist]);
		}
		return flx_error_default(err, rc, NULL);
	}
	rc = parse(o, value, &nv, err);
	if (rc) {
		val_free(&nv);
		return flx_error_default(err, rc, NULL);
	}
	if (old) {
		/* the latest comes last (flx_opt_order()) */
		size_t at = (size_t)(old - vals->v);

		val_free(old);
		memmove(old, old + 1, (vals->n - at - 1) * sizeof(*old));
		vals->v[vals->n - 1] = nv;
		return 0;
	}
	{
		flx_opt_val *g = realloc(vals->v, (vals->n + 1) * sizeof(*g));

		if (!g) {
			val_free(&nv);
			return flx_error_set(err, -ENOMEM, NULL, o->name,
					     "out of memory");
		}
		vals->v = g;
		g[vals->n++] = nv;
	}
	return 0;
}

int flx_opt_vals_copy(flx_opt_vals *dst, const flx_opt_vals *src)
{
	dst->v = NULL;
	dst->n = 0;
	if (!src || !src->n)
		return 0;
	dst->v = calloc(src->n, sizeof(*dst->v));
	if (!dst->v)
		return -ENOMEM;
	for (size_t i = 0; i < src->n; i++) {
		const flx_opt_val *s = &src->v[i];
		flx_opt_val *d = &dst->v[i];

		dst->n = i + 1;
		d->opt = s->opt;
		d->num = s->num;
		if (s->text && !(d->text = strdup(s->text)))
			goto nomem;
		if (s->nlist && !(d->list = calloc(s->nlist, sizeof(*d->list))))
			goto nomem;
		for (size_t k = 0; k < s->nlist; k++, d->nlist++)
			if (!(d->list[k] = strdup(s->list[k])))
				goto nomem;
	}
	return 0;
nomem:
	flx_opt_vals_release(dst);
	return -ENOMEM;
}

int flx_opt_order(const flx_opt_vals *vals, const char *name)
{
	const flx_opt_val *v = find(vals, name);

	return v ? (int)(v - vals->v) : -ENOENT;
}

bool flx_opt_given(const flx_opt_vals *vals, const char *name)
{
	return find(vals, name) != NULL;
}

int flx_opt_u64(const flx_opt_vals *vals, const char *name, uint64_t *out)
{
	const flx_opt_val *v = find(vals, name);

	if (!v)
		return -ENOENT;
	if (v->opt->type != FLX_OPT_UINT && v->opt->type != FLX_OPT_SIZE &&
	    v->opt->type != FLX_OPT_CHOICE)
		return -EINVAL;
	*out = v->num;
	return 0;
}

int flx_opt_flag(const flx_opt_vals *vals, const char *name, bool *out)
{
	const flx_opt_val *v = find(vals, name);

	if (!v)
		return -ENOENT;
	if (v->opt->type != FLX_OPT_FLAG)
		return -EINVAL;
	*out = v->num != 0;
	return 0;
}

int flx_opt_text(const flx_opt_vals *vals, const char *name, const char **out)
{
	const flx_opt_val *v = find(vals, name);

	if (!v)
		return -ENOENT;
	if (!v->text)
		return -EINVAL;
	*out = v->text;
	return 0;
}

int flx_opt_list(const flx_opt_vals *vals, const char *name, char *const **out,
		 size_t *n)
{
	const flx_opt_val *v = find(vals, name);

	if (!v)
		return -ENOENT;
	if (v->opt->type != FLX_OPT_GLOBS)
		return -EINVAL;
	*out = v->list;
	*n = v->nlist;
	return 0;
}

const flx_opt *flx_opt_group_find(const flx_opt_group *g, const char *name)
{
	for (size_t i = 0; g && i < g->nopts; i++)
		if (!strcmp(g->opts[i].name, name))
			return &g->opts[i];
	return NULL;
}

const char *flx_opt_synopsis(const flx_opt *o, char *buf, size_t cap)
{
	if (o->type == FLX_OPT_FLAG) {
		snprintf(buf, cap, "%s[=0|1]", o->name);
	} else if (o->type == FLX_OPT_CHOICE && !o->metavar) {
		size_t n = (size_t)snprintf(buf, cap, "%s=", o->name);

		for (size_t i = 0; o->choices && o->choices[i] && n < cap; i++)
			n += (size_t)snprintf(buf + n, cap - n, "%s%s",
					      i ? "|" : "", o->choices[i]);
	} else {
		snprintf(buf, cap, "%s=%s%s", o->name,
			 o->metavar ? o->metavar : "VALUE",
			 o->type == FLX_OPT_GLOBS ? "[:...]" : "");
	}
	return buf;
}

const char *flx_opt_help_text(const flx_opt *o, char *buf, size_t cap)
{
	if (o->def)
		snprintf(buf, cap, "%s (default: %s)", o->help, o->def);
	else
		snprintf(buf, cap, "%s", o->help);
	return buf;
}

/* Print text word-wrapped: the first line continues at column col of the
 * current line, the next ones are indented to col; width 79. */
static void wrap(FILE *f, const char *text, int col)
{
	int at = col;

	while (*text) {
		size_t w = strcspn(text, " ");

		if (at > col && at + 1 + (int)w > 79) {
			fprintf(f, "\n%*s", col, "");
			at = col;
		} else if (at > col) {
			fputc(' ', f);
			at++;
		}
		fprintf(f, "%.*s", (int)w, text);
		at += (int)w;
		text += w;
		while (*text == ' ')
			text++;
	}
	fputc('\n', f);
}

void flx_opt_print_help(FILE *f, const flx_opt_group *g, unsigned prog)
{
	bool head = false;

	for (size_t i = 0; i < g->nopts; i++) {
		const flx_opt *o = &g->opts[i];
		char syn[128], help[1024];
		int n;

		if (!flx_opt_for(o, prog))
			continue;
		if (!head)
			fprintf(f, "%s:\n", g->title);
		head = true;
		n = fprintf(f, "    -o %s",
			    flx_opt_synopsis(o, syn, sizeof(syn)));
		if (n > 29) {
			fprintf(f, "\n%*s", 30, "");
		} else {
			fprintf(f, "%*s", 30 - n, "");
		}
		wrap(f, flx_opt_help_text(o, help, sizeof(help)), 30);
	}
	if (head)
		fputc('\n', f);
}

int flx_parse_flag(const char *key, const char *value, bool *out,
		   flx_error *err)
{
	if (!value || !strcmp(value, "1") || !strcmp(value, "true"))
		*out = true;
	else if (!strcmp(value, "0") || !strcmp(value, "false"))
		*out = false;
	else
		return flx_error_set(err, -EINVAL, NULL, key,
				     "expected 0/1/true/false, got '%s'",
				     value);
	return 0;
}

int flx_parse_size(const char *text, uint64_t *out)
{
	unsigned long long n;
	char *end;
	unsigned shift = 0;

	if (!text || *text < '0' || *text > '9')
		return -EINVAL;
	errno = 0;
	n = strtoull(text, &end, 10);
	if (errno)
		return -EINVAL;
	switch (*end) {
	case '\0':
		break;
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	case 't':
	case 'T':
		shift = 40;
		end++;
		break;
	default:
		return -EINVAL;
	}
	if (*end == 'i' || *end == 'B') /* accept 5GiB / 5GB spellings */
		end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
	if (*end || (shift && n > (~0ull >> shift)) || n == 0)
		return -EINVAL;
	*out = (uint64_t)n << shift;
	return 0;
}
