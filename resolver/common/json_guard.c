/* SPDX-License-Identifier: MIT */
#include "json_guard.h"

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
