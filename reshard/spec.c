/* SPDX-License-Identifier: MIT */
#include "spec.h"

#include "source.h"

#include "json_guard.h"
#include "transform.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_RULES_BYTES (16u << 20)

int flx_spec_init(flx_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->tp = 1;
	s->pp = 1;
	s->hf_shard_size = FLX_DEFAULT_HF_SHARD_SIZE;
	s->layer_regex = strdup(FLX_DEFAULT_LAYER_REGEX);
	s->embed_regex = strdup(FLX_DEFAULT_EMBED_REGEX);
	if (!s->layer_regex || !s->embed_regex) {
		flx_spec_release(s);
		return -ENOMEM;
	}
	return 0;
}

static void free_rules(flx_rule *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(r[i].match);
	free(r);
}

static void free_strings(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static void stmts_free(void **stmts);

void flx_spec_release(flx_spec *s)
{
	if (!s)
		return;
	free_strings(s->include, s->ninclude);
	free_strings(s->exclude, s->nexclude);
	free(s->strip_prefix);
	flx_opt_vals_release(&s->opts);
	for (size_t i = 0; i < s->nfacts; i++)
		free(s->facts[i]);
	free(s->facts);
	free(s->rules_path);
	free(s->layer_regex);
	free(s->embed_regex);
	free_rules(s->rules, s->nrules);
	flx_xform_free(s->xform);
	stmts_free(s->stmts);
	memset(s, 0, sizeof(*s));
}

/* Strict decimal: digits only, no sign, no trailing text, no overflow. */
static int parse_int(const char *v, long lo, long hi, long *out)
{
	char *end;
	long n;

	if (!v || !*v || *v < '0' || *v > '9')
		return -EINVAL;
	errno = 0;
	n = strtol(v, &end, 10);
	if (errno || *end || n < lo || n > hi)
		return -EINVAL;
	*out = n;
	return 0;
}

/*
 * glibc's regcomp() expands stacked and large repetitions into an
 * automaton that grows exponentially (\.+++++... takes gigabytes), so
 * before compiling, refuse what POSIX leaves undefined anyway (a
 * duplication operator right after another) and bound the length and the
 * {m,n} counts.  Escaped characters and bracket expressions are skipped.
 */
#define MAX_REGEX_LEN 256
#define MAX_REGEX_DUP 32

static const char *regex_too_costly(const char *re)
{
	bool after_dup = false;

	if (strlen(re) > MAX_REGEX_LEN)
		return "longer than 256 characters";
	for (const char *p = re; *p; p++) {
		bool dup = false;

		if (*p == '\\' && p[1]) {
			p++;
		} else if (*p == '[') {
			/* a bracket expression: ']' first is literal */
			p += p[1] == '^' ? 2 : 1;
			if (*p == ']')
				p++;
			while (*p && *p != ']')
				p++;
			if (!*p)
				return NULL; /* regcomp reports it */
		} else if (*p == '*' || *p == '+' || *p == '?') {
			dup = true;
		} else if (*p == '{') {
			char *end;
			long lo = strtol(p + 1, &end, 10), hi = lo;

			/* {m,} costs m copies and a star: only m counts */
			if (*end == ',' && end[1] != '}')
				hi = strtol(end + 1, &end, 10);
			if (lo > MAX_REGEX_DUP || hi > MAX_REGEX_DUP)
				return "a repetition count above 32";
			dup = true;
		}
		if (dup && after_dup)
			return "a repetition right after another (undefined "
			       "in POSIX)";
		after_dup = dup;
		if (*p == '{')
			while (p[1] && *p != '}')
				p++;
	}
	return NULL;
}

static int check_regex(const char *key, const char *re, int min_groups,
		       flx_error *err)
{
	const char *why = regex_too_costly(re);
	regex_t rx;
	int rc;

	if (why)
		return flx_error_set(err, -EINVAL, NULL, key,
				     "regular expression refused: %s", why);
	rc = regcomp(&rx, re, REG_EXTENDED);

	if (rc == REG_ESPACE)
		return flx_error_set(err, -ENOMEM, NULL, key, "out of memory");
	if (rc) {
		char msg[128];

		regerror(rc, &rx, msg, sizeof(msg));
		return flx_error_set(err, -EINVAL, NULL, key,
				     "invalid regular expression: %s", msg);
	}
	rc = (int)rx.re_nsub < min_groups;
	regfree(&rx);
	if (rc)
		return flx_error_set(err, -EINVAL, NULL, key,
				     "needs a capture group for the layer "
				     "index");
	return 0;
}

static int set_string(char **dst, const char *v)
{
	char *copy = strdup(v);

	if (!copy)
		return -ENOMEM;
	free(*dst);
	*dst = copy;
	return 0;
}

static int load_rules_file(flx_spec *s, const char *path, flx_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	struct stat st;
	char *buf = NULL;
	ssize_t got;
	int rc;

	if (fd < 0)
		return flx_error_set(err, -errno, path, "rules",
				     "cannot open rules file: %s",
				     strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    st.st_size > MAX_RULES_BYTES) {
		close(fd);
		return flx_error_set(err, -EINVAL, path, "rules",
				     "not a regular file of at most 16 MiB");
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	got = read(fd, buf, (size_t)st.st_size);
	close(fd);
	if (got != st.st_size) {
		free(buf);
		return flx_error_set(err, -EIO, path, "rules",
				     "short read of the rules file");
	}
	rc = flx_spec_rules_parse(s, buf, (size_t)got, path, err);
	free(buf);
	return rc;
}

int flx_spec_preset_dir(char *buf, size_t len)
{
	const char *env = getenv("FLEXFS_PRESET_DIR");
	char exe[4096];
	ssize_t n;
	char *slash;

	if (env && *env) {
		if (strlen(env) >= len)
			return -ENAMETOOLONG;
		strcpy(buf, env);
		return 0;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n < 0)
		return -errno;
	exe[n] = '\0';
	/* <prefix>/bin/flexfs -> <prefix>/share/flexfs/rules */
	slash = strrchr(exe, '/');
	if (slash)
		*slash = '\0';
	slash = strrchr(exe, '/');
	if (slash)
		*slash = '\0';
	if ((size_t)snprintf(buf, len, "%s/share/flexfs/rules", exe) >= len)
		return -ENAMETOOLONG;
	return 0;
}

/* A preset's name: letters, digits, '-', '_' and '.' (no '/', no leading
 * '.'), so that it names a file of the preset directory and nothing else. */
static bool preset_name_ok(const char *name)
{
	if (!*name || *name == '.' || strlen(name) > 64)
		return false;
	for (const char *c = name; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
		      (*c >= '0' && *c <= '9') || strchr("-_.", *c)))
			return false;
	return true;
}

/* rules=@NAME: the preset's file.  @return 0 and path, or -errno with err. */
static int preset_path(const char *name, char *path, size_t len, flx_error *err)
{
	char dir[4096];
	int rc;

	if (!preset_name_ok(name))
		return flx_error_set(err, -EINVAL, NULL, "rules",
				     "'@%s' is not a preset name (letters, "
				     "digits, '-', '_', '.'; see "
				     "flexfs-inspect --list-presets)",
				     name);
	rc = flx_spec_preset_dir(dir, sizeof(dir));
	if (rc)
		return flx_error_set(err, rc, NULL, "rules",
				     "no preset directory: %s", strerror(-rc));
	if ((size_t)snprintf(path, len, "%s/%s.json", dir, name) >= len)
		return flx_error_set(err, -ENAMETOOLONG, dir, "rules",
				     "preset path too long");
	if (access(path, F_OK) != 0)
		return flx_error_set(err, -ENOENT, path, "rules",
				     "no preset '%s' (see flexfs-inspect "
				     "--list-presets)",
				     name);
	return 0;
}

/* Append the ':'-separated globs of value to *v.  @return 0, -EINVAL
 * (an empty glob) or -ENOMEM. */
static int add_globs(char ***v, size_t *n, const char *key, const char *value,
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
		nv = realloc(*v, (*n + 1) * sizeof(**v));
		if (!nv)
			return -ENOMEM;
		*v = nv;
		if (!(nv[*n] = strndup(p, len)))
			return -ENOMEM;
		++*n;
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

static int spec_set(flx_spec *s, const char *key, const char *value,
		    flx_error *err)
{
	long n;
	int rc;

	if (strcmp(key, "tp") == 0 || strcmp(key, "pp") == 0) {
		long hi = key[0] == 't' ? FLX_MAX_TP : FLX_MAX_PP;

		if (parse_int(value, 1, hi, &n))
			return flx_error_set(err, -EINVAL, NULL, key,
					     "expected an integer from 1 to "
					     "%ld, got '%s'",
					     hi, value ? value : "");
		*(key[0] == 't' ? &s->tp : &s->pp) = (int)n;
		return 0;
	}
	if (strcmp(key, "rules") == 0) {
		char preset[4096 + 80];

		if (!value || !*value)
			return flx_error_set(err, -EINVAL, NULL, key,
					     "expected a file name or @PRESET");
		if (value[0] == '@') {
			rc =
			    preset_path(value + 1, preset, sizeof(preset), err);
			if (rc)
				return rc;
			value = preset;
		}
		rc = load_rules_file(s, value, err);
		s->rules_preset = value == preset;
		return rc ? rc : set_string(&s->rules_path, value);
	}
	if (strcmp(key, "layer_regex") == 0 ||
	    strcmp(key, "embed_regex") == 0) {
		bool layer = key[0] == 'l';

		if (!value || !*value)
			return flx_error_set(err, -EINVAL, NULL, key,
					     "expected a regular expression");
		rc = check_regex(key, value, layer ? 1 : 0, err);
		if (rc)
			return rc;
		return set_string(layer ? &s->layer_regex : &s->embed_regex,
				  value);
	}
	if (strcmp(key, "include") == 0)
		return add_globs(&s->include, &s->ninclude, key, value, err);
	if (strcmp(key, "exclude") == 0)
		return add_globs(&s->exclude, &s->nexclude, key, value, err);
	if (strcmp(key, "strip_prefix") == 0) {
		if (!value || !*value)
			return flx_error_set(
			    err, -EINVAL, NULL, key,
			    "expected a prefix such as model.");
		return set_string(&s->strip_prefix, value);
	}
	if (strcmp(key, "pp_renumber") == 0)
		return flx_parse_flag(key, value, &s->pp_renumber, err);
	if (strcmp(key, "hf_shard_size") == 0) {
		if (flx_parse_size(value, &s->hf_shard_size))
			return flx_error_set(err, -EINVAL, NULL, key,
					     "expected a positive size such as "
					     "5G or 500M, got '%s'",
					     value ? value : "");
		return 0;
	}
	return -ENOENT;
}

static const flx_opt spec_opts[] = {
    {.name = "tp",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "1",
     .help = "tensor-parallel ranks of the view",
     .min = 1,
     .max = FLX_MAX_TP},
    {.name = "pp",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "1",
     .help = "pipeline stages of the view",
     .min = 1,
     .max = FLX_MAX_PP},
    {.name = "rules",
     .type = FLX_OPT_TEXT,
     .metavar = "FILE|@NAME",
     .help = "JSON placement rules (split axis, stage) per FQN glob, or "
	     "@NAME, a shipped preset (flexfs-inspect --list-presets)"},
    {.name = "layer_regex",
     .type = FLX_OPT_TEXT,
     .metavar = "ERE",
     .help = "finds the layer index of an FQN (its last group)"},
    {.name = "embed_regex",
     .type = FLX_OPT_TEXT,
     .metavar = "ERE",
     .help = "FQNs that belong to the first stage"},
    {.name = "pp_renumber",
     .type = FLX_OPT_FLAG,
     .help = "stage-local layer numbers in stage views"},
    {.name = "hf_shard_size",
     .type = FLX_OPT_SIZE,
     .metavar = "SIZE",
     .def = "5G",
     .help = "bytes per hf/ shard, K/M/G/T suffixes"},
    {.name = "include",
     .type = FLX_OPT_GLOBS,
     .metavar = "GLOB",
     .help = "serve only the tensors and objects matching one (fnmatch, "
	     "names as saved; repeatable)"},
    {.name = "exclude",
     .type = FLX_OPT_GLOBS,
     .metavar = "GLOB",
     .help = "leave out those matching one (repeatable)"},
    {.name = "strip_prefix",
     .type = FLX_OPT_TEXT,
     .metavar = "PREFIX",
     .help = "cut PREFIX (e.g. model.) from the served names"},
};

const flx_opt_group flx_spec_opt_group = {
    .owner = "spec",
    .title = "View options",
    .opts = spec_opts,
    .nopts = FLX_OPT_COUNT(spec_opts),
    .core = true,
};

int flx_spec_set(flx_spec *s, const char *key, const char *value,
		 flx_error *err)
{
	int rc = spec_set(s, key, value, err);

	/* -ENOENT (unknown key) is the caller's to report */
	return rc == -ENOENT ? rc : flx_error_default(err, rc, NULL);
}

static int rule_error(flx_error *err, const char *name, size_t i,
		      const char *field, const char *why)
{
	char key[64];

	snprintf(key, sizeof(key), "rule %zu: %s", i, field);
	return flx_error_set(err, -EINVAL, name, key, "%s", why);
}

/* The facts a rule may name, "\"a\", \"b\"", into buf. */
static void fact_list(char *buf, size_t cap)
{
	const char *f;
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; (f = flx_fact_name(i)) && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\"",
				      i ? ", " : "", f);
}

/* fact's bit in s's fact table (added when new): 0..FLX_SPEC_MAX_FACTS-1,
 * -E2BIG when the table is full, or -ENOMEM. */
static int fact_bit(flx_spec *s, const char *fact)
{
	char **nf;

	for (size_t i = 0; i < s->nfacts; i++)
		if (!strcmp(s->facts[i], fact))
			return (int)i;
	if (s->nfacts == FLX_SPEC_MAX_FACTS)
		return -E2BIG;
	nf = realloc(s->facts, (s->nfacts + 1) * sizeof(*nf));
	if (!nf)
		return -ENOMEM;
	s->facts = nf;
	if (!(nf[s->nfacts] = strdup(fact)))
		return -ENOMEM;
	return (int)s->nfacts++;
}

static int parse_rule(flx_spec *s, json_t *o, flx_rule *r, const char *name,
		      size_t i, flx_error *err)
{
	const char *k;
	json_t *v;

	if (!json_is_object(o))
		return rule_error(err, name, i, "rule", "not a JSON object");
	json_object_foreach(o, k, v)
	{
		if (strcmp(k, "match") == 0) {
			if (!json_is_string(v) || !*json_string_value(v))
				return rule_error(err, name, i, k,
						  "expected a non-empty glob "
						  "string");
			if (!(r->match = strdup(json_string_value(v))))
				return -ENOMEM;
		} else if (strcmp(k, "split") == 0) {
			if (json_is_null(v)) {
				r->split = FLX_SPLIT_NONE;
			} else if (json_is_integer(v) &&
				   json_integer_value(v) >= 0 &&
				   json_integer_value(v) < 16) {
				r->split = FLX_SPLIT_AXIS;
				r->axis = (int)json_integer_value(v);
			} else {
				return rule_error(err, name, i, k,
						  "expected an axis (0-15) or "
						  "null");
			}
		} else if (strcmp(k, "stage") == 0) {
			const char *sv = json_string_value(v);

			if (json_is_integer(v) && json_integer_value(v) >= 0 &&
			    json_integer_value(v) < FLX_MAX_PP) {
				r->stage = FLX_STAGE_N;
				r->stage_n = (int)json_integer_value(v);
			} else if (sv && !strcmp(sv, "first")) {
				r->stage = FLX_STAGE_FIRST;
			} else if (sv && !strcmp(sv, "last")) {
				r->stage = FLX_STAGE_LAST;
			} else if (sv && !strcmp(sv, "all")) {
				r->stage = FLX_STAGE_ALL;
			} else {
				return rule_error(err, name, i, k,
						  "expected \"first\", "
						  "\"last\", \"all\" or a "
						  "stage number");
			}
		} else if (strcmp(k, "groups") == 0) {
			if (!json_is_integer(v) || json_integer_value(v) < 2 ||
			    json_integer_value(v) > 64)
				return rule_error(err, name, i, k,
						  "expected a number of parts "
						  "(2-64)");
			r->groups = (int)json_integer_value(v);
		} else if (strcmp(k, "when") == 0) {
			const char *sv = json_string_value(v);
			int bit;

			if (!sv || !flx_fact_known(sv)) {
				char list[FLX_ERR_FIELD / 2];
				char why[FLX_ERR_FIELD];

				fact_list(list, sizeof(list));
				snprintf(why, sizeof(why),
					 "expected a model fact (%s)", list);
				return rule_error(err, name, i, k, why);
			}
			bit = fact_bit(s, sv);
			if (bit < 0)
				return bit == -ENOMEM
					   ? bit
					   : rule_error(err, name, i, k,
							"too many distinct "
							"facts");
			r->when |= 1u << bit;
		} else if (strcmp(k, "note") == 0) {
			/* free text for the reader (flexfs-inspect's
			 * templates record the saved axes in it) */
			if (!json_is_string(v))
				return rule_error(err, name, i, k,
						  "expected a string");
		} else {
			return rule_error(err, name, i, k,
					  "unknown key (expected match, "
					  "split, stage, groups, when, "
					  "note)");
		}
	}
	if (!r->match)
		return rule_error(err, name, i, "match", "missing");
	if (r->groups && r->split != FLX_SPLIT_AXIS)
		return rule_error(err, name, i, "groups", "needs a split axis");
	return 0;
}

/* The kind whose key k is, or -1. */
static int stmt_kind(const char *k)
{
	for (int i = 0; flx_stmt_kinds[i]; i++)
		if (!strcmp(flx_stmt_kinds[i]->key, k))
			return i;
	return -1;
}

static void stmts_free(void **stmts)
{
	for (int i = 0; i < FLX_MAX_STMT_KINDS && flx_stmt_kinds[i]; i++) {
		if (stmts[i])
			flx_stmt_kinds[i]->free(stmts[i]);
		stmts[i] = NULL;
	}
}

/* One kind's statements, the array st under key k, into *out. */
static int parse_stmts(const flx_stmt_kind *kind, json_t *st, void **out,
		       const char *name, flx_error *err)
{
	const char **v = NULL;
	size_t n;
	int rc = 0;

	if (!json_is_array(st))
		return flx_error_set(err, -EINVAL, name, kind->key,
				     "expected an array of strings");
	n = json_array_size(st);
	v = calloc(n ? n : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < n && !rc; i++) {
		v[i] = json_string_value(json_array_get(st, i));
		if (!v[i])
			rc = flx_error_set(err, -EINVAL, name, kind->key,
					   "element %zu is not a string", i);
	}
	if (!rc)
		rc = kind->parse(v, n, name, out, err);
	free(v);
	return rc;
}

/* Rules file v2: {"<kind>": [strings], "rules": [v1 rules]}, each
 * optional; *arr is the rules array (NULL when absent). */
static int parse_v2(json_t *root, void **stmts, json_t **arr, const char *name,
		    flx_error *err)
{
	const char *k;
	json_t *val;
	int rc = 0;

	json_object_foreach(root, k, val)
	{
		if (stmt_kind(k) < 0 && strcmp(k, "rules") && strcmp(k, "note"))
			return flx_error_set(err, -EINVAL, name, k,
					     "unknown key of the rules object");
	}
	*arr = json_object_get(root, "rules");
	for (int i = 0; !rc && flx_stmt_kinds[i]; i++) {
		json_t *st = json_object_get(root, flx_stmt_kinds[i]->key);

		if (st)
			rc = parse_stmts(flx_stmt_kinds[i], st, &stmts[i], name,
					 err);
	}
	return rc;
}

int flx_spec_rules_parse(flx_spec *s, const char *json, size_t len,
			 const char *name, flx_error *err)
{
	json_error_t je;
	json_t *root, *arr;
	flx_rule *rules = NULL;
	void *stmts[FLX_MAX_STMT_KINDS] = {NULL};
	size_t n = 0;
	int rc = 0;

	flx_json_guard_begin();
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	/* a failed allocation can leave jansson with a tree that silently
	 * lacks a member: whatever it returned, the guard decides */
	if (flx_json_guard_failed()) {
		json_decref(root);
		return flx_error_set(err, -ENOMEM, name, "rules",
				     "out of memory");
	}
	if (!root)
		return flx_error_set(err, -EINVAL, name, "rules",
				     "invalid JSON at line %d column %d: %s",
				     je.line, je.column, je.text);
	arr = root;
	if (json_is_object(root)) {
		rc = parse_v2(root, stmts, &arr, name, err);
		if (rc)
			goto out;
	}
	if (arr && !json_is_array(arr)) {
		rc = flx_error_set(err, -EINVAL, name, "rules",
				   "expected a JSON array of rule objects "
				   "or an object with \"%s\" and \"rules\"",
				   flx_stmt_kinds[0] ? flx_stmt_kinds[0]->key
						     : "rules");
		goto out;
	}
	n = arr ? json_array_size(arr) : 0;
	rules = calloc(n ? n : 1, sizeof(*rules));
	if (!rules) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n && !rc; i++)
		rc = parse_rule(s, json_array_get(arr, i), &rules[i], name, i,
				err);
	if (rc) {
		free_rules(rules, n);
		goto out;
	}
	free_rules(s->rules, s->nrules);
	s->rules = rules;
	s->nrules = n;
	stmts_free(s->stmts);
	memcpy(s->stmts, stmts, sizeof(stmts));
	memset(stmts, 0, sizeof(stmts));
out:
	stmts_free(stmts);
	json_decref(root);
	return flx_error_default(err, rc, name);
}

const flx_rule *flx_spec_match_facts(const flx_spec *s, const char *fqn,
				     unsigned facts)
{
	for (size_t i = 0; i < s->nrules; i++)
		if ((s->rules[i].when & ~facts) == 0 &&
		    fnmatch(s->rules[i].match, fqn, 0) == 0)
			return &s->rules[i];
	return NULL;
}

const flx_rule *flx_spec_match(const flx_spec *s, const char *fqn)
{
	return flx_spec_match_facts(s, fqn, 0);
}

/*
 * (^|\.)layers\.([0-9]+)\. by hand.  POSIX picks the leftmost match:
 * the first "layers." that starts the name or follows a '.', and whose
 * digit run is followed by a '.' (the digit run is then the only one the
 * group can take, as [0-9]+ cannot reach past the '.').  Start positions
 * of later candidates are all greater, so the first that completes wins.
 */
bool flx_default_layer_match(const char *fqn, size_t *so, size_t *eo)
{
	for (const char *p = fqn; (p = strstr(p, "layers.")); p++) {
		const char *d = p + 7, *q = d;

		if (p != fqn && p[-1] != '.')
			continue;
		while (*q >= '0' && *q <= '9')
			q++;
		if (q > d && *q == '.') {
			*so = (size_t)(d - fqn);
			*eo = (size_t)(q - fqn);
			return true;
		}
	}
	return false;
}
