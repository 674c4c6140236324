/* SPDX-License-Identifier: MIT */
#include "mountopts.h"

#include "ckpt.h"
#include "plugins.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const gpu_modes[] = {"auto", "on", "off", NULL};

/* The checkpoint's open (flx_ckpt_opts). */
static const flx_opt open_opts[] = {
    {.name = "source_format",
     .type = FLX_OPT_TEXT,
     .metavar = "NAME",
     .def = "detected from the directory",
     .help = "read the checkpoint as NAME, one of the checkpoint formats "
	     "listed above"},
    {.name = "follow_symlinks",
     .type = FLX_OPT_FLAG,
     .help = "serve files that are symlinks leading outside CHECKPOINT (a "
	     "cache snapshot whose files link into a shared blob store)"},
};

/* How the kernel and the daemon read and cache (the FUSE adapter). */
static const flx_opt fuse_opts[] = {
    {.name = "nonempty",
     .type = FLX_OPT_FLAG,
     .help = "mount over a non-empty MOUNTPOINT"},
    {.name = "log",
     .type = FLX_OPT_PATH,
     .metavar = "FILE",
     .help = "once mounted, also append every message (each failed read's "
	     "file and reason) to FILE"},
    {.name = "read_ahead_kb",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "4 requests, about 4 MiB; 0: the kernel's",
     .help = "readahead of the mount in KiB: the size of FUSE read "
	     "requests in flight (needs root)",
     .max = FLX_MO_READ_AHEAD_KB_MAX},
    {.name = "direct_io",
     .type = FLX_OPT_FLAG,
     .help = "read() bypasses the page cache: one copy less and no second "
	     "cached copy of the data; mmap still works (Linux >= 6.6); for "
	     "large reads"},
    {.name = "passthrough",
     .type = FLX_OPT_FLAG,
     .def = "0, off",
     .help = "files that are one backing file byte for byte (hf/ of a "
	     "checkpoint flexfs wrote, verbatim files) are read by the kernel "
	     "from it once open (FUSE passthrough, Linux >= 6.9, root); a "
	     "backing file rewritten in place after open is then served as it "
	     "is, not refused"},
    {.name = "push_ahead_kb",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "0, off",
     .help = "after a read lands in a tensor, store up to N KiB more of it "
	     "in the page cache ahead of the reader",
     .max = FLX_MO_PUSH_AHEAD_KB_MAX},
    {.name = "cache_size",
     .type = FLX_OPT_SIZE,
     .metavar = "SIZE",
     .def = "the largest such chunk, 64M to 4G and 1/8 of memory; 0: none, "
	    "each read re-reads them",
     .help = "memory for backing-file blocks of tensors saved transposed "
	     "(strided), K/M/G/T suffixes"},
};

/* The slicer (gpu/slice.h). */
static const flx_opt gpu_opts[] = {
    {.name = "gpu",
     .type = FLX_OPT_CHOICE,
     .def = "auto",
     .help = "strided gathers on the GPU (CUDA, libflexfs-cuda.so): when a "
	     "device is found (auto), or fail the mount without one (on), or "
	     "never (off)",
     .choices = gpu_modes},
    {.name = "gpu_min",
     .type = FLX_OPT_SIZE,
     .metavar = "SIZE",
     .def = "1M",
     .help = "the GPU takes gathers of SIZE bytes or more"},
    {.name = "gpu_device",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "0",
     .help = "the CUDA device to use",
     .max = 1023},
    {.name = "gpu_cache",
     .type = FLX_OPT_SIZE,
     .metavar = "SIZE",
     .def = "1G; 0: none",
     .help = "device memory keeping blocks across reads"},
};

/* The distributed mount (resolver/remote/mpi_mount.h). */
static const flx_opt mpi_opts[] = {
    {.name = "mpi",
     .type = FLX_OPT_FLAG,
     .help = "one daemon per rank of mpirun: the ranks' CHECKPOINT "
	     "directories ({rank}: the rank) together hold the checkpoint; "
	     "every rank serves all of it"},
    {.name = "mpi_timeout",
     .type = FLX_OPT_UINT,
     .metavar = "SECONDS",
     .def = "30",
     .help = "how long a read waits for another rank",
     .min = 1,
     .max = 86400},
};

static const flx_opt_group core_groups[] = {
    {.owner = "open",
     .title = "Checkpoint options",
     .opts = open_opts,
     .nopts = FLX_OPT_COUNT(open_opts),
     .core = true},
    {.owner = "fuse",
     .title = "Mount options (the FUSE adapter)",
     .opts = fuse_opts,
     .nopts = FLX_OPT_COUNT(fuse_opts),
     .core = true},
    {.owner = "gpu",
     .title = "GPU slicer options",
     .opts = gpu_opts,
     .nopts = FLX_OPT_COUNT(gpu_opts),
     .core = true},
    {.owner = "mpi",
     .title = "Distributed mount options",
     .opts = mpi_opts,
     .nopts = FLX_OPT_COUNT(mpi_opts),
     .core = true},
};

const char flx_mo_help_tail[] =
    "Always added: ro, default_permissions, subtype=flexfs,\n"
    "fsname=CHECKPOINT.  Ignored: auto, noauto, user, nouser, users,\n"
    "_netdev, nofail, defaults, rw, comment=*, x-*.  Other -o options go\n"
    "to libfuse; use \\, for a comma in a value.\n";

const flx_opt_group *flx_mo_group(size_t i)
{
	size_t ncore = FLX_OPT_COUNT(core_groups);

	if (i == 0)
		return &flx_spec_opt_group;
	if (i - 1 < ncore)
		return &core_groups[i - 1];
	return flx_plugin_group(i - 1 - ncore);
}

const flx_opt *flx_mo_find(const char *name, size_t len,
			   const flx_opt_group **group)
{
	const flx_opt_group *g;

	for (size_t i = 0; (g = flx_mo_group(i)); i++)
		for (size_t k = 0; k < g->nopts; k++)
			if (strlen(g->opts[k].name) == len &&
			    !strncmp(g->opts[k].name, name, len)) {
				if (group)
					*group = g;
				return &g->opts[k];
			}
	return NULL;
}

void flx_mo_print_formats(FILE *f)
{
	const char *name;
	int col = fprintf(f, "Checkpoint formats:");

	for (size_t i = 0; (name = flx_ckpt_format_name(i)); i++) {
		int w = (int)strlen(name) + 2;

		if (col + w > 79) {
			fprintf(f, "\n   ");
			col = 3;
		}
		col += fprintf(f, " %s%s", name,
			       flx_ckpt_format_name(i + 1) ? "," : "");
	}
	fprintf(f, "\n");
}

void flx_mo_print_help(FILE *f, unsigned prog)
{
	const flx_opt_group *g;

	for (size_t i = 0; (g = flx_mo_group(i)); i++) {
		flx_opt_print_help(f, g, prog);
	}
	fprintf(f, "%s", flx_mo_help_tail);
}

static const char *const fstab_exact[] = {
    "auto",    "noauto", "user",     "nouser", "users",
    "_netdev", "nofail", "defaults", "",
};

/* Options whose value is free text written by fstab, systemd or mount(8)
 * (user=NAME shows up for "user" fstab entries). */
static const char *const fstab_keyed[] = {"comment", "user"};

flx_ckpt_opts flx_mo_ckpt_opts(const flx_mountopts *mo)
{
	return (flx_ckpt_opts){.format = mo->source_format,
			       .vals = &mo->spec.opts,
			       .follow_symlinks = mo->follow_symlinks};
}

int flx_mo_init(flx_mountopts *mo)
{
	memset(mo, 0, sizeof(*mo));
	mo->read_ahead_kb = FLX_MO_READ_AHEAD_AUTO;
	mo->cache_size = FLX_MO_CACHE_AUTO;
	mo->push_ahead_kb = FLX_MO_PUSH_AHEAD_KB_DEFAULT;
	mo->gpu = (flx_slicer_opts){FLX_GPU_AUTO, FLX_GPU_MIN_DEFAULT, 0, NULL,
				    FLX_GPU_CACHE_DEFAULT};
	return flx_spec_init(&mo->spec);
}

void flx_mo_release(flx_mountopts *mo)
{
	if (!mo)
		return;
	flx_spec_release(&mo->spec);
	flx_mo_tokens_free(mo->fuse, mo->nfuse);
	free(mo->source);
	free(mo->source_format);
	free(mo->log_file);
	memset(mo, 0, sizeof(*mo));
}

void flx_mo_tokens_free(char **tok, size_t n)
{
	for (size_t i = 0; tok && i < n; i++)
		free(tok[i]);
	free(tok);
}

static int push(char ***v, size_t *n, char *s)
{
	char **nv = realloc(*v, (*n + 1) * sizeof(**v));

	if (!nv) {
		free(s);
		return -ENOMEM;
	}
	nv[(*n)++] = s;
	*v = nv;
	return 0;
}

static int is_octal(char c, char hi)
{
	return c >= '0' && c <= hi;
}

/* The byte of a 3-digit octal escape "ooo" (\000 to \377) at s, or -1:
 * the escape of libfuse's option lists and of /proc/self/mountinfo. */
static int octal3(const char *s)
{
	if (!is_octal(s[0], '3') || !is_octal(s[1], '7') ||
	    !is_octal(s[2], '7'))
		return -1;
	return (s[0] - '0') * 64 + (s[1] - '0') * 8 + (s[2] - '0');
}

int flx_mo_split(const char *opts, char ***out, size_t *n)
{
	size_t len = strlen(opts);
	char *cur = malloc(len + 1);
	char **tok = NULL;
	size_t ntok = 0, d = 0;
	int rc = cur ? 0 : -ENOMEM;

	for (const char *s = opts; !rc; s++) {
		if (*s == ',' || *s == '\0') {
			cur[d] = '\0';
			if (d && !(rc = push(&tok, &ntok, strdup(cur))) &&
			    !tok[ntok - 1])
				rc = -ENOMEM;
			d = 0;
			if (*s == '\0')
				break;
		} else if (s[0] == '\\' && s[1]) {
			/* Same rules as libfuse's process_real_option_group. */
			s++;
			if (octal3(s) >= 0) {
				cur[d++] = (char)octal3(s);
				s += 2;
			} else {
				cur[d++] = *s;
			}
		} else {
			cur[d++] = *s;
		}
	}
	free(cur);
	if (rc) {
		flx_mo_tokens_free(tok, ntok);
		return rc;
	}
	*out = tok;
	*n = ntok;
	return 0;
}

/* Length of the key part of "key=value" (or the whole token). */
static size_t key_len(const char *tok)
{
	const char *eq = strchr(tok, '=');

	return eq ? (size_t)(eq - tok) : strlen(tok);
}

static bool key_is(const char *tok, const char *key)
{
	return key_len(tok) == strlen(key) && !strncmp(tok, key, strlen(key));
}

/* The value of "key=value", or NULL for a bare "key". */
static const char *option_value(const char *tok)
{
	size_t kl = key_len(tok);

	return tok[kl] == '=' ? tok + kl + 1 : NULL;
}

static int key_in(const char *tok, const char *const *keys, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (key_is(tok, keys[i]))
			return 1;
	return 0;
}

flx_mo_class flx_mo_classify(const char *tok)
{
	size_t nfx = sizeof(fstab_exact) / sizeof(fstab_exact[0]);

	if (flx_mo_find(tok, key_len(tok), NULL))
		return FLX_MO_OURS;
	for (size_t i = 0; i < nfx; i++)
		if (!strcmp(tok, fstab_exact[i]))
			return FLX_MO_FSTAB;
	if (!strncmp(tok, "x-", 2) ||
	    (strchr(tok, '=') &&
	     key_in(tok, fstab_keyed,
		    sizeof(fstab_keyed) / sizeof(fstab_keyed[0]))))
		return FLX_MO_FSTAB;
	if (!strcmp(tok, "rw") || !strcmp(tok, "ro"))
		return FLX_MO_RWRO;
	return FLX_MO_FUSE;
}

/* A number of KiB from 0 to max, the value of option key. */
static int parse_kb(const char *key, const char *value, unsigned max,
		    unsigned *out, flx_error *err)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = value && *value >= '0' && *value <= '9' ? strtoul(value, &end, 10)
						    : ULONG_MAX;
	if (v == ULONG_MAX || errno || *end || v > max)
		return flx_error_set(err, -EINVAL, NULL, key,
				     "'%s' is not a number of KiB from 0 to %u",
				     value ? value : "", max);
	*out = (unsigned)v;
	return 0;
}

static int apply_read_ahead(flx_mountopts *mo, const char *value,
			    flx_error *err)
{
	int rc = parse_kb("read_ahead_kb", value, FLX_MO_READ_AHEAD_KB_MAX,
			  &mo->read_ahead_kb, err);

	if (!rc)
		mo->ra_given = true;
	return rc;
}

static int apply_source_format(flx_mountopts *mo, const char *value,
			       flx_error *err)
{
	char known[FLX_ERR_FIELD] = "";
	const char *name;
	size_t n = 0;
	char *copy;

	for (size_t i = 0; (name = flx_ckpt_format_name(i)); i++) {
		if (value && strcmp(value, name) == 0)
			goto found;
		if (n < sizeof(known))
			n += (size_t)snprintf(known + n, sizeof(known) - n,
					      "%s%s", i ? ", " : "", name);
	}
	return flx_error_set(err, -EINVAL, NULL, "source_format",
			     "'%s' is not a checkpoint format (%s)",
			     value ? value : "", known);
found:
	copy = strdup(value);
	if (!copy)
		return -ENOMEM;
	free(mo->source_format);
	mo->source_format = copy;
	return 0;
}

static int apply_cache_size(flx_mountopts *mo, const char *value,
			    flx_error *err)
{
	uint64_t v = 0;

	/* flx_parse_size() refuses 0, a valid value here */
	if ((!value || strcmp(value, "0") != 0) && flx_parse_size(value, &v))
		v = UINT64_MAX;
	if (v == UINT64_MAX ||
	    (v && (v < FLX_MO_CACHE_MIN || v > FLX_MO_CACHE_MAX)))
		return flx_error_set(err, -EINVAL, NULL, "cache_size",
				     "'%s' is not 0 or a size from 1M to 1T",
				     value ? value : "");
	mo->cache_size = v;
	return 0;
}

/* gpu=, gpu_min= and gpu_cache= (0, or a size), gpu_device= (0 to 1023) */
static int apply_gpu(flx_mountopts *mo, const char *tok, flx_error *err)
{
	static const char *const modes[] = {"auto", "on", "off"};
	const char *v = option_value(tok);
	uint64_t n = 0;

	if (key_is(tok, "gpu")) {
		for (int i = 0; v && i < 3; i++)
			if (!strcmp(v, modes[i])) {
				mo->gpu.mode = (flx_gpu_mode)i;
				return 0;
			}
		return flx_error_set(err, -EINVAL, NULL, "gpu",
				     "'%s' is not auto, on or off", v ? v : "");
	}
	if (key_is(tok, "gpu_min") || key_is(tok, "gpu_cache")) {
		bool min = key_is(tok, "gpu_min");

		if ((!v || strcmp(v, "0") != 0) && flx_parse_size(v, &n))
			return flx_error_set(
			    err, -EINVAL, NULL, min ? "gpu_min" : "gpu_cache",
			    "'%s' is not 0 or a size", v ? v : "");
		*(min ? &mo->gpu.min_bytes : &mo->gpu.cache_bytes) = n;
		return 0;
	}
	for (const char *p = v; p && *p; p++)
		n = *p >= '0' && *p <= '9' && n < 1024 ? n * 10 + (*p - '0')
						       : 1024;
	if (!v || !*v || n > 1023)
		return flx_error_set(err, -EINVAL, NULL, "gpu_device",
				     "'%s' is not a device number (0 to 1023)",
				     v ? v : "");
	mo->gpu.device = (int)n;
	return 0;
}

uint64_t flx_mo_cache_fit(uint64_t span)
{
	/* whole 1 MiB blocks, two more than the span needs */
	if (span > FLX_MO_CACHE_MAX)
		span = FLX_MO_CACHE_MAX;
	return ((span + FLX_MO_CACHE_MIN - 1) / FLX_MO_CACHE_MIN + 2) *
	       FLX_MO_CACHE_MIN;
}

uint64_t flx_mo_cache_bytes(const flx_mountopts *mo, uint64_t span,
			    uint64_t phys)
{
	uint64_t want, cap = FLX_MO_CACHE_AUTO_MAX;

	if (mo->cache_size != FLX_MO_CACHE_AUTO)
		return mo->cache_size;
	if (phys && phys / 8 < cap)
		cap = phys / 8;
	if (cap < FLX_MO_CACHE_FLOOR)
		cap = FLX_MO_CACHE_FLOOR;
	want = flx_mo_cache_fit(span);
	if (want < FLX_MO_CACHE_FLOOR)
		want = FLX_MO_CACHE_FLOOR;
	return want < cap ? want : cap;
}

static int apply_ours(flx_spec *spec, const char *tok, flx_error *err)
{
	size_t kl = key_len(tok);
	const char *value = option_value(tok);
	char key[32];
	flx_error e;
	int rc;

	snprintf(key, sizeof(key), "%.*s", (int)kl, tok);
	if (!value && strcmp(key, "pp_renumber") != 0)
		return flx_error_set(err, -EINVAL, NULL, key,
				     "needs a value (%s=...)", key);
	/* A local error tells "unknown key" (-ENOENT, nothing recorded) from
	 * a value error that happens to be -ENOENT (rules=/missing). */
	flx_error_init(&e);
	rc = flx_spec_set(spec, key, value, &e);
	if (rc == 0)
		return 0;
	if (!e.code && rc == -ENOENT)
		flx_error_set(&e, -EINVAL, NULL, key,
			      "not supported by this build");
	else if (!e.code)
		flx_error_set(&e, rc, NULL, key, "%s", strerror(-rc));
	flx_error_key(&e, key);
	if (err && !err->code)
		*err = e;
	return e.code;
}

/* log=FILE, made absolute (the daemon changes to / when it detaches) */
static int apply_log(flx_mountopts *mo, const char *value, flx_error *err)
{
	char *p;
	int rc = flx_parse_path("log", value, &p, err);

	if (rc)
		return rc;
	free(mo->log_file);
	mo->log_file = p;
	return 0;
}

/* mpi_timeout=SECONDS: 1 to 86400. */
static int apply_mpi_timeout(flx_mountopts *mo, const char *v, flx_error *err)
{
	char *end;
	unsigned long n;

	errno = 0;
	n = v && *v >= '0' && *v <= '9' ? strtoul(v, &end, 10) : 0;
	if (!n || errno || *end || n > 86400)
		return flx_error_set(err, -EINVAL, NULL, "mpi_timeout",
				     "expected seconds, 1 to 86400, got '%s'",
				     v ? v : "");
	mo->mpi_timeout = (unsigned)n;
	return 0;
}

int flx_mo_option(flx_mountopts *mo, const char *tok, flx_error *err)
{
	const flx_opt_group *group = NULL;
	const flx_opt *opt;
	char *copy;

	switch (flx_mo_classify(tok)) {
	case FLX_MO_OURS:
		opt = flx_mo_find(tok, key_len(tok), &group);
		/* read_ahead_kb, direct_io and cache_size are the mount's,
		 * not the view's: how the kernel and the daemon read and
		 * cache, so they never reach the spec (flexfs-inspect has
		 * no use for them). */
		if (key_is(tok, "read_ahead_kb"))
			return apply_read_ahead(mo, option_value(tok), err);
		if (key_is(tok, "direct_io"))
			return flx_parse_flag("direct_io", option_value(tok),
					      &mo->direct_io, err);
		if (key_is(tok, "passthrough"))
			return flx_parse_flag("passthrough", option_value(tok),
					      &mo->passthrough, err);
		if (key_is(tok, "push_ahead_kb"))
			return parse_kb("push_ahead_kb", option_value(tok),
					FLX_MO_PUSH_AHEAD_KB_MAX,
					&mo->push_ahead_kb, err);
		if (key_is(tok, "follow_symlinks"))
			return flx_parse_flag("follow_symlinks",
					      option_value(tok),
					      &mo->follow_symlinks, err);
		if (key_is(tok, "nonempty"))
			return flx_parse_flag("nonempty", option_value(tok),
					      &mo->nonempty, err);
		if (key_is(tok, "mpi"))
			return flx_parse_flag("mpi", option_value(tok),
					      &mo->mpi, err);
		if (key_is(tok, "mpi_timeout"))
			return apply_mpi_timeout(mo, option_value(tok), err);
		if (key_is(tok, "log"))
			return apply_log(mo, option_value(tok), err);
		if (key_is(tok, "cache_size"))
			return apply_cache_size(mo, option_value(tok), err);
		if (key_is(tok, "gpu") || key_is(tok, "gpu_min") ||
		    key_is(tok, "gpu_device") || key_is(tok, "gpu_cache"))
			return apply_gpu(mo, tok, err);
		if (key_is(tok, "source_format"))
			return apply_source_format(mo, option_value(tok), err);
		if (!group->core)
			return flx_opt_vals_set(&mo->spec.opts, opt,
						option_value(tok), err);
		return apply_ours(&mo->spec, tok, err);
	case FLX_MO_FSTAB:
	case FLX_MO_RWRO:
		return 0;
	case FLX_MO_FUSE:
		break;
	}
	if (!strncmp(tok, "fsname=", 7))
		mo->has_fsname = true;
	if (!strncmp(tok, "subtype=", 8))
		mo->has_subtype = true;
	copy = strdup(tok);
	if (!copy || push(&mo->fuse, &mo->nfuse, copy))
		return flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
	return 0;
}

int flx_mo_options(flx_mountopts *mo, const char *opts, flx_error *err)
{
	char **tok;
	size_t n;
	int rc = flx_mo_split(opts, &tok, &n);

	if (rc)
		return flx_error_set(err, rc, NULL, NULL, "out of memory");
	for (size_t i = 0; i < n && !rc; i++)
		rc = flx_mo_option(mo, tok[i], err);
	flx_mo_tokens_free(tok, n);
	return rc;
}

int flx_mo_set_source(flx_mountopts *mo, const char *src)
{
	char *copy = strdup(src);

	if (!copy)
		return -ENOMEM;
	free(mo->source);
	mo->source = copy;
	return 0;
}

char *flx_mo_escape(const char *s)
{
	char *out = malloc(2 * strlen(s) + 1), *d = out;

	if (!out)
		return NULL;
	for (; *s; s++) {
		if (*s == ',' || *s == '\\')
			*d++ = '\\';
		*d++ = *s;
	}
	*d = '\0';
	return out;
}

/* Append "," (unless first) and escape(tok) prefixed by pre to *buf. */
static int append(char **buf, size_t *len, const char *pre, const char *tok)
{
	char *esc = flx_mo_escape(tok);
	size_t add = esc ? strlen(pre) + strlen(esc) + 1 : 0;
	char *nb = esc ? realloc(*buf, *len + add + 1) : NULL;

	if (!nb) {
		free(esc);
		return -ENOMEM;
	}
	*len += (size_t)sprintf(nb + *len, "%s%s%s", *len ? "," : "", pre, esc);
	*buf = nb;
	free(esc);
	return 0;
}

int flx_mo_fuse_optstring(const flx_mountopts *mo, char **out)
{
	char *buf = NULL;
	size_t len = 0;
	int rc = 0;

	if (!mo->source)
		return -EINVAL;
	for (size_t i = 0; i < mo->nfuse && !rc; i++)
		rc = append(&buf, &len, "", mo->fuse[i]);
	/* ro last, so it would win even over a stray rw. */
	if (!rc)
		rc = append(&buf, &len, "", "ro");
	if (!rc)
		rc = append(&buf, &len, "", "default_permissions");
	if (!rc && !mo->has_subtype)
		rc = append(&buf, &len, "subtype=", FLX_MO_SUBTYPE);
	if (!rc && !mo->has_fsname)
		rc = append(&buf, &len, "fsname=", mo->source);
	if (rc) {
		free(buf);
		return rc;
	}
	*out = buf;
	return 0;
}

bool flx_mo_is_helper(const char *argv0)
{
	const char *base = argv0 ? strrchr(argv0, '/') : NULL;

	base = base ? base + 1 : argv0;
	return base && !strncmp(base, "mount.", 6);
}

/* mount(8)'s flags that mean something else to libfuse. */
static int helper_flag(const char *a)
{
	return !strcmp(a, "-s") || !strcmp(a, "-f") || !strcmp(a, "-n") ||
	       !strcmp(a, "-v");
}

int flx_mo_argv(int argc, char **argv, int *out_argc, char ***out_argv)
{
	char **v = calloc((size_t)argc + 1, sizeof(*v));
	bool helper = argc > 0 && flx_mo_is_helper(argv[0]);
	bool rest = false;
	int n = 0;

	if (!v)
		return -ENOMEM;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];

		if (!helper || i == 0 || rest) {
			v[n++] = argv[i];
		} else if (!strcmp(a, "--")) {
			rest = true;
			v[n++] = argv[i];
		} else if (!strcmp(a, "-o")) {
			v[n++] = argv[i];
			if (i + 1 < argc)
				v[n++] = argv[++i];
		} else if (!strcmp(a, "-t")) {
			i++; /* and its TYPE */
		} else if (!strncmp(a, "-t", 2) || helper_flag(a)) {
			continue;
		} else {
			v[n++] = argv[i];
		}
	}
	v[n] = NULL;
	*out_argc = n;
	*out_argv = v;
	return 0;
}

/* Copy a mountinfo field from s to out (cap bytes, truncated), undoing
 * its escapes (space, tab, newline and backslash as \ooo); the field ends
 * at the first space.  @return the field's unescaped length. */
static size_t mountinfo_field(const char *s, char *out, size_t cap)
{
	size_t n = 0;

	for (; *s && *s != ' ' && *s != '\n'; s++) {
		char c = *s;

		if (c == '\\' && octal3(s + 1) >= 0) {
			c = (char)octal3(s + 1);
			s += 3;
		}
		if (n + 1 < cap)
			out[n] = c;
		n++;
	}
	if (cap)
		out[n < cap ? n : cap - 1] = '\0';
	return n;
}

/* The topmost entry of mountinfo at mnt, of a "fuse*" type when fuse_only:
 * its MAJ:MIN in dev[64] and its type in type[64].  @return 0, or -ENOENT
 * when none matches. */
static int mountinfo_find(const char *mountinfo, const char *mnt,
			  bool fuse_only, char *dev, char *type)
{
	char path[4096], mm[64], ty[64];
	const char *line = mountinfo;
	bool found = false;

	/* id parent MAJ:MIN root mountpoint options [optional...] - fstype */
	while (line && *line) {
		const char *nl = strchr(line, '\n'), *f = line, *sep;
		int i;

		for (i = 0; i < 2 && f; i++) {
			f = strchr(f, ' ');
			f = f ? f + 1 : NULL;
		}
		sep = strstr(line, " - ");
		if (f && sep && (!nl || sep < nl) &&
		    mountinfo_field(f, mm, sizeof(mm)) < sizeof(mm) &&
		    mountinfo_field(sep + 3, ty, sizeof(ty)) < sizeof(ty)) {
			const char *mp = strchr(f, ' ');

			mp = mp ? strchr(mp + 1, ' ') : NULL;
			if (mp &&
			    mountinfo_field(mp + 1, path, sizeof(path)) <
				sizeof(path) &&
			    !strcmp(path, mnt) &&
			    (!fuse_only || !strncmp(ty, "fuse", 4))) {
				memcpy(dev, mm, sizeof(mm));
				memcpy(type, ty, sizeof(ty));
				found = true;
			}
		}
		line = nl ? nl + 1 : NULL;
	}
	return found ? 0 : -ENOENT;
}

int flx_mo_mountinfo_dev(const char *mountinfo, const char *mnt, char *dev,
			 size_t len)
{
	char found[64], type[64];

	if (mountinfo_find(mountinfo, mnt, true, found, type))
		return -ENOENT;
	if (strlen(found) >= len)
		return -ENAMETOOLONG;
	strcpy(dev, found);
	return 0;
}

int flx_mo_mountinfo_type(const char *mountinfo, const char *mnt, char *type,
			  size_t len)
{
	char dev[64], found[64];

	if (mountinfo_find(mountinfo, mnt, false, dev, found))
		return -ENOENT;
	if (strlen(found) >= len)
		return -ENAMETOOLONG;
	strcpy(type, found);
	return 0;
}
