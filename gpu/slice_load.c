/* SPDX-License-Identifier: MIT */
/*
 * Choosing a mount's slicer from the table of device backends: the CUDA
 * backend when libflexfs-cuda.so loads and finds its device, else the CPU
 * one (slice.h, slice_cuda.h).
 */
#include "slice.h"
#include "slice_cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A loaded device backend: the slicer its batches go through. */
typedef struct dl_slicer {
	flx_slicer base; /* first: run() gets &base */
	const flx_cuda_api *api;
	void *dev, *dl;
	uint64_t min_bytes;
} dl_slicer;

static bool dl_accepts(const flx_slicer *self, const flx_slice_batch *b)
{
	const dl_slicer *s = (const dl_slicer *)self;
	uint64_t n = 0;

	for (size_t i = 0; i < b->nruns && n < s->min_bytes; i++)
		n += b->runs[i].len;
	return n >= s->min_bytes;
}

static int dl_run(const flx_slicer *self, const flx_slice_batch *b)
{
	const dl_slicer *s = (const dl_slicer *)self;
	int rc = flx_slice_batch_check(b);

	return rc ? rc : s->api->run(s->dev, b);
}

/* dlopen() the first of the places the object may be: the test override
 * (FLEXFS_CUDA_LIB), next to the executable, the install directory, the
 * build tree.  *tried: the last path tried, for the message. */
static void *open_library(const char *path, char *tried, size_t n)
{
	static const char *const fixed[] = {FLX_CUDA_INSTALL_PATH,
					    FLX_CUDA_BUILD_PATH};
	char exe[PATH_MAX], *slash;
	ssize_t len;
	void *dl;

	if (path) {
		snprintf(tried, n, "%s", path);
		return dlopen(path, RTLD_NOW | RTLD_LOCAL);
	}
	len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (len > 0) {
		exe[len] = '\0';
		slash = strrchr(exe, '/');
		if (slash) {
			snprintf(tried, n, "%.*s/%s", (int)(slash - exe), exe,
				 FLX_CUDA_LIBRARY);
			dl = dlopen(tried, RTLD_NOW | RTLD_LOCAL);
			if (dl)
				return dl;
		}
	}
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
		if (!fixed[i][0])
			continue;
		snprintf(tried, n, "%s", fixed[i]);
		dl = dlopen(tried, RTLD_NOW | RTLD_LOCAL);
		if (dl)
			return dl;
	}
	return NULL;
}

static void dl_start(const flx_slicer *s)
{
	((const dl_slicer *)s)->api->start(((const dl_slicer *)s)->dev);
}

static void dl_close(const flx_slicer *s)
{
	dl_slicer *d = (dl_slicer *)s;

	d->api->close(d->dev);
	dlclose(d->dl);
	free(d);
}

/* The CUDA backend for o, or -ENODEV/-EIO/-ENOMEM with line saying why. */
static int dl_open(const flx_slicer_backend *be, const flx_slicer_opts *o,
		   const flx_slicer **out, char *line, size_t n)
{
	char tried[PATH_MAX + 64] = "", what[256] = "";
	const char *env = getenv("FLEXFS_CUDA_LIB");
	flx_cuda_entry_fn entry;
	dl_slicer *s;
	void *dl =
	    open_library(o->library ? o->library : env, tried, sizeof(tried));
	int rc;

	if (!dl) {
		snprintf(line, n, "%s not loaded (%s)", FLX_CUDA_LIBRARY,
			 tried[0] ? dlerror() : "not built");
		return -ENODEV;
	}
	*(void **)&entry = dlsym(dl, FLX_CUDA_ENTRY);
	if (!entry || !entry() || entry()->abi != FLX_CUDA_ABI) {
		snprintf(line, n, "%s: not a flexfs CUDA backend (ABI %u)",
			 tried, (unsigned)FLX_CUDA_ABI);
		dlclose(dl);
		return -ENODEV;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		dlclose(dl);
		return -ENOMEM;
	}
	rc = entry()->open(o->device, o->cache_bytes, what, sizeof(what),
			   &s->dev);
	if (rc) {
		snprintf(line, n, "%s", what[0] ? what : strerror(-rc));
		free(s);
		dlclose(dl);
		return rc;
	}
	s->base = (flx_slicer){be->name, dl_accepts, dl_run, true, be};
	s->api = entry();
	s->dl = dl;
	s->min_bytes = o->min_bytes;
	snprintf(line, n, "device %d (%s)", o->device, what);
	*out = &s->base;
	return 0;
}

static const flx_slicer_backend cuda_backend = {"cuda", "CUDA", dl_open,
						dl_start, dl_close};

/* The CPU backend as an entry: always there, static. */
static int cpu_open(const flx_slicer_backend *be, const flx_slicer_opts *o,
		    const flx_slicer **out, char *line, size_t n)
{
	(void)be, (void)o;
	*out = flx_slicer_cpu();
	snprintf(line, n, "the host");
	return 0;
}

static const flx_slicer_backend cpu_backend = {"cpu", NULL, cpu_open, NULL,
					       NULL};

/* The backends, best first: the device ones, then the host's (device
 * NULL), which is what a mount gets when no device backend opens. */
static const flx_slicer_backend *const backends[] = {&cuda_backend,
						     &cpu_backend, NULL};

int flx_slicer_open_from(const flx_slicer_backend *const *table,
			 const flx_slicer_opts *o, const flx_slicer **out,
			 char *line, size_t n)
{
	char why[PATH_MAX + 512] = "", next[PATH_MAX + 512];
	const flx_slicer_backend *first = NULL;
	int rc = 0, first_rc = 0;

	for (size_t i = 0; table[i] && !first; i++)
		if (table[i]->device)
			first = table[i];

	*out = flx_slicer_cpu();
	if (o->mode == FLX_GPU_OFF) {
		snprintf(line, n, "slicer: cpu (gpu=off)");
		return 0;
	}
	for (size_t i = 0; table[i]; i++) {
		const flx_slicer *s = NULL;

		/* the host's entry is the fallback below, not a device */
		if (!table[i]->device)
			continue;
		next[0] = '\0';
		rc = table[i]->open(table[i], o, &s, next, sizeof(next));
		if (!rc) {
			*out = s;
			snprintf(line, n,
				 "slicer: %s on %s for strided gathers and "
				 "casts of %llu bytes or more, cpu below",
				 table[i]->name, next,
				 (unsigned long long)o->min_bytes);
			return 0;
		}
		if (table[i] == first) {
			memcpy(why, next, sizeof(why));
			first_rc = rc;
		}
		if (rc == -ENOMEM)
			first_rc = rc;
	}
	if (!first)
		snprintf(why, sizeof(why), "no device backend");
	rc = first ? first_rc : -ENODEV;
	if (o->mode == FLX_GPU_ON) {
		snprintf(line, n, "gpu=on: no usable %s device: %s",
			 first ? first->device : "GPU", why);
		return rc == -ENOMEM ? rc : -ENODEV;
	}
	snprintf(line, n, "slicer: cpu (gpu=auto: %s)", why);
	return rc == -ENOMEM ? rc : 0;
}

int flx_slicer_open(const flx_slicer_opts *o, const flx_slicer **out,
		    char *line, size_t n)
{
	return flx_slicer_open_from(backends, o, out, line, n);
}

void flx_slicer_start(const flx_slicer *s)
{
	if (s && s->backend && s->backend->start)
		s->backend->start(s);
}

void flx_slicer_close(const flx_slicer *s)
{
	if (s && s->backend && s->backend->close)
		s->backend->close(s);
}

static const flx_slicer *auto_slicer;

static void open_auto(void)
{
	flx_slicer_opts o = {FLX_GPU_AUTO, FLX_GPU_MIN_DEFAULT, 0, NULL,
			     FLX_GPU_CACHE_DEFAULT};
	char line[PATH_MAX + 600];

	if (flx_slicer_open(&o, &auto_slicer, line, sizeof(line)))
		auto_slicer = flx_slicer_cpu();
}

const flx_slicer *flx_slicer_default(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, open_auto);
	return auto_slicer;
}
