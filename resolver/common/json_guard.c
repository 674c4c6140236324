/* SPDX-License-Identifier: MIT */
#include "json_guard.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>

static _Thread_local bool failed;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void *guarded_malloc(size_t n)
{
	void *p = malloc(n);

	if (!p)
		failed = true;
	return p;
}

static void install(void)
{
	json_set_alloc_funcs(guarded_malloc, free);
}

void flx_json_guard_begin(void)
{
	pthread_once(&once, install);
	failed = false;
}

bool flx_json_guard_failed(void)
{
	return failed;
}

int flx_json_parse(const void *buf, size_t len, const char *file,
		   const char *key, json_t **out, flx_error *err)
{
	json_error_t je;
	json_t *root;

	flx_json_guard_begin();
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (flx_json_guard_failed()) {
		json_decref(root);
		return -ENOMEM;
	}
	if (!root)
		return flx_error_set(err, -EINVAL, file, key,
				     "not valid JSON: line %d column %d: %s",
				     je.line, je.column, je.text);
	*out = root;
	return 0;
}
