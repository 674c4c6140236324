/* SPDX-License-Identifier: MIT */
#include "mountopts.h"

#include "ckpt.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char flx_mo_help[] =
    "flexfs options:\n"
    "    -o tp=N                tensor-parallel ranks of the view "
    "(default 1)\n"
    "    -o pp=N                pipeline stages of the view (default 1)\n"
    "    -o rules=FILE          JSON placement rules (split axis, stage) "
    "per FQN glob\n"
    "    -o rules=@NAME         a shipped preset (flexfs-inspect "
    "--list-presets)\n"
    "    -o layer_regex=ERE     finds the layer index of an FQN (last "
    "group)\n"
    "    -o embed_regex=ERE     FQNs that belong to the first stage\n"
    "    -o pp_renumber[=0|1]   stage-local layer numbers in stage "
    "views\n"
    "    -o hf_shard_size=SIZE  bytes per hf/ shard, K/M/G/T suffixes "
    "(default 5G)\n"
    "    -o include=GLOB[:GLOB...]  serve only the tensors and objects "
    "matching\n"
    "                           one (fnmatch, names as saved; repeatable)\n"
    "    -o exclude=GLOB[:GLOB...]  leave out those matching one\n"
    "    -o strip_prefix=PREFIX cut PREFIX (e.g. model.) from the served "
    "names\n"
    "    -o source_format=NAME  read the checkpoint as torch-dcp or "
    "hf-safetensors\n"
    "                           (default: detected from the directory)\n"
    "    -o paddle_id=N         the unique id of a Paddle checkpoint to "
    "read\n"
    "                           (default: the highest in the directory)\n"
    "    -o megatron_ep=N       megatron/ legacy files for expert "
    "parallel size N\n"
    "    -o megatron_vp=N       megatron/ legacy files with N virtual "
    "pipeline chunks\n"
    "    -o megatron_iter=N     the iteration of a Megatron save "
    "directory to read\n"
    "                           (default: the one "
    "latest_checkpointed_iteration.txt names)\n"
    "    -o src_strategy=FILE   a MindSpore checkpoint's parallel strategy "
    "file\n"
    "                           (protobuf, or JSON when named *.json)\n"
    "    -o follow_symlinks[=0|1]  serve files that are symlinks "
    "leading outside\n"
    "                           CHECKPOINT (a Hugging Face cache "
    "snapshot)\n"
    "    -o nonempty[=0|1]      mount over a non-empty MOUNTPOINT\n"
    "    -o log=FILE            once mounted, also append every message "
    "(each\n"
    "                           failed read's file and reason) to FILE\n"
    "    -o mpi[=0|1]           one daemon per rank of mpirun: the ranks' "
    "CHECKPOINT\n"
    "                           directories ({rank}: the rank) together "
    "hold the\n"
    "                           checkpoint; every rank serves all of it\n"
    "    -o mpi_timeout=SECONDS how long a read waits for another rank "
    "(default 30)\n"
    "    -o megatron_spec=SPEC  names in megatron/ legacy files: local "
    "or te\n"
    "                           (Transformer Engine; default local)\n"
    "    -o megatron_true_vocab=V  the tokenizer's vocab size: megatron/ "
    "pads\n"
    "                           the vocab to a multiple of it (default: the "
    "saved rows)\n"
    "    -o aoa_num_heads=H,aoa_num_key_value_groups=G  fused_qkv's heads "
    "where\n"
    "                           an AOA statement omits them\n"
    "    -o aoa_src_tp=N        fused_ffn's and fused_qkv_old's src_tp "
    "where an AOA\n"
    "                           statement omits it (the source's TP "
    "degree)\n"
    "    -o mindspore[=0|1]     mindspore/rank_N/checkpoint_N.ckpt: the "
    "tp x pp\n"
    "                           ranks as MindSpore .ckpt files\n"
    "    -o dst_strategy=FILE   their layout from a MindSpore strategy "
    "file instead\n"
    "                           (protobuf, or JSON if FILE ends in .json)\n"
    "    -o read_ahead_kb=N     readahead of the mount in KiB: the size of "
    "FUSE\n"
    "                           read requests in flight (default: 4 "
    "requests,\n"
    "                           about 4 MiB; 0: the kernel's; needs root)\n"
    "    -o direct_io[=0|1]     read() bypasses the page cache: one copy "
    "less and\n"
    "                           no second cached copy of the data; mmap "
    "still\n"
    "                           works (Linux >= 6.6); for large reads\n"
    "    -o passthrough[=0|1]   files that are one backing file byte for "
    "byte (hf/\n"
    "                           of a checkpoint flexfs wrote, verbatim "
    "files) are\n"
    "                           read by the kernel from it once open "
    "(FUSE\n"
    "                           passthrough, Linux >= 6.9, root); a "
    "backing file\n"
    "                           rewritten in place after open is then "
    "served as it\n"
    "                           is, not refused (default: 0, off)\n"
    "    -o push_ahead_kb=N     after a read lands in a tensor, store up to "
    "N KiB\n"
    "                           more of it in the page cache ahead of the "
    "reader\n"
    "                           (default: 0, off)\n"
    "    -o cache_size=SIZE     memory for backing-file blocks of tensors "
    "saved\n"
    "                           transposed (strided), K/M/G/T suffixes "
    "(default:\n"
    "                           the largest such chunk, 64M to 4G and 1/8 "
    "of\n"
    "                           memory; 0: none, each read re-reads "
    "them)\n"
    "    -o gpu=auto|on|off     strided gathers on the GPU (CUDA, "
    "libflexfs-cuda.so):\n"
    "                           when a device is found (auto), or fail "
    "the mount\n"
    "                           without one (on), or never (off)\n"
    "    -o gpu_min=SIZE        the GPU takes gathers of SIZE bytes or "
    "more (1M)\n"
    "    -o gpu_device=N        the CUDA device to use (0)\n"
    "    -o gpu_cache=SIZE      device memory keeping blocks across reads "
    "(1G;\n"
    "                           0: none)\n"
    "    Always added: ro, default_permissions, subtype=flexfs,\n"
    "    fsname=CHECKPOINT.  Ignored: auto, noauto, user, nouser, users,\n"
    "    _netdev, nofail, defaults, rw, comment=*, x-*.  Other -o options\n"
    "    go to libfuse (listed below); use \\, for a comma in a value.\n";

static const char *const ours[] = {
    "tp",
    "pp",
    "rules",
    "layer_regex",
    "embed_regex",
    "pp_renumber",
    "hf_shard_size",
    "read_ahead_kb",
    "direct_io",
    "passthrough",
    "push_ahead_kb",
    "cache_size",
    "source_format",
    "paddle_id",
    "src_strategy",
    "include",
    "exclude",
    "strip_prefix",
    "follow_symlinks",
    "nonempty",
    "log",
    "megatron_spec",
    "megatron_true_vocab",
    "megatron_iter",
    "megatron_ep",
    "megatron_vp",
    "aoa_num_heads",
    "aoa_num_key_value_groups",
    "aoa_src_tp",
    "gpu",
    "gpu_min",
    "gpu_device",
    "gpu_cache",
    "mpi",
    "mpi_timeout",
    "mindspore",
    "dst_strategy",
};

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
			       .has_paddle_id = mo->has_paddle_id,
			       .paddle_id = mo->paddle_id,
			       .has_megatron_iter = mo->has_megatron_iter,
			       .megatron_iter = mo->megatron_iter,
			       .ms_strategy = mo->src_strategy,
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
	free(mo->src_strategy);
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

	if (key_in(tok, ours, sizeof(ours) / sizeof(ours[0])))
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

/* A decimal id as Paddle names its files ("{id}.metadata"): digits
 * only, no sign, no leading zero but in "0". */
static int apply_paddle_id(flx_mountopts *mo, const char *value, flx_error *err)
{
	uint64_t v = 0;
	const char *p = value ? value : "";

	if (!*p || (p[0] == '0' && p[1]) || strlen(p) > 19)
		goto bad;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			goto bad;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	mo->paddle_id = v;
	mo->has_paddle_id = true;
	return 0;
bad:
	return flx_error_set(err, -EINVAL, NULL, "paddle_id",
			     "'%s' is not a checkpoint id (a decimal number)",
			     value ? value : "");
}

/* An iteration number as Megatron writes it in its tracker file: digits
 * only, no sign, at most 18. */
static int apply_megatron_iter(flx_mountopts *mo, const char *value,
			       flx_error *err)
{
	uint64_t v = 0;
	const char *p = value ? value : "";

	if (!*p || strlen(p) > 18)
		goto bad;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			goto bad;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	mo->megatron_iter = v;
	mo->has_megatron_iter = true;
	return 0;
bad:
	return flx_error_set(err, -EINVAL, NULL, "megatron_iter",
			     "'%s' is not an iteration (a decimal number)",
			     value ? value : "");
}

/* A path kept absolute: the daemon changes directory after the parse. */
static int apply_src_strategy(flx_mountopts *mo, const char *value,
			      flx_error *err)
{
	char *p = NULL, cwd[4096];

	if (!value || !*value)
		return flx_error_set(err, -EINVAL, NULL, "src_strategy",
				     "needs a strategy file's path");
	if (value[0] == '/')
		p = strdup(value);
	else if (getcwd(cwd, sizeof(cwd)) &&
		 asprintf(&p, "%s/%s", cwd, value) < 0)
		p = NULL;
	if (!p)
		return flx_error_set(err, -ENOMEM, NULL, "src_strategy",
				     "out of memory");
	free(mo->src_strategy);
	mo->src_strategy = p;
	return 0;
}

/* log=FILE, made absolute (the daemon changes to / when it detaches) */
static int apply_log(flx_mountopts *mo, const char *value, flx_error *err)
{
	char *p = NULL, cwd[4096];

	if (!value || !*value)
		return flx_error_set(err, -EINVAL, NULL, "log",
				     "needs a file's path");
	if (value[0] == '/')
		p = strdup(value);
	else if (!getcwd(cwd, sizeof(cwd)))
		return flx_error_set(err, -errno, NULL, "log",
				     "a relative path, and no working "
				     "directory: %s",
				     strerror(errno));
	else if (asprintf(&p, "%s/%s", cwd, value) < 0)
		p = NULL;
	if (!p)
		return flx_error_set(err, -ENOMEM, NULL, "log",
				     "out of memory");
	free(mo->log_file);
	mo->log_file = p;
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
	if (!value && strcmp(key, "pp_renumber") != 0 &&
	    strcmp(key, "mindspore") != 0)
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
	char *copy;

	switch (flx_mo_classify(tok)) {
	case FLX_MO_OURS:
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
		if (key_is(tok, "cache_size"))
			return apply_cache_size(mo, option_value(tok), err);
		if (key_is(tok, "gpu") || key_is(tok, "gpu_min") ||
		    key_is(tok, "gpu_device") || key_is(tok, "gpu_cache"))
			return apply_gpu(mo, tok, err);
		if (key_is(tok, "source_format"))
			return apply_source_format(mo, option_value(tok), err);
		if (key_is(tok, "paddle_id"))
			return apply_paddle_id(mo, option_value(tok), err);
		if (key_is(tok, "megatron_iter"))
			return apply_megatron_iter(mo, option_value(tok), err);
		if (key_is(tok, "src_strategy"))
			return apply_src_strategy(mo, option_value(tok), err);
		if (key_is(tok, "log"))
			return apply_log(mo, option_value(tok), err);
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
