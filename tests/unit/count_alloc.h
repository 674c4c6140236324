/* SPDX-License-Identifier: MIT */
#ifndef FLX_TEST_COUNT_ALLOC_H
#define FLX_TEST_COUNT_ALLOC_H

/*
 * Counting allocations, for tests that a path allocates nothing: this
 * header defines malloc, calloc and realloc (include it in one file of a
 * test program), each counting into nallocs.  Not under ASan, which owns
 * malloc: there COUNT_ALLOC_OFF is defined and nothing is counted.
 */

#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOC_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COUNT_ALLOC_OFF 1
#endif
#endif

#ifndef COUNT_ALLOC_OFF
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);

static unsigned long nallocs;

void *malloc(size_t n)
{
	nallocs++;
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	nallocs++;
	return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	nallocs++;
	return __libc_realloc(p, n);
}
#endif

#endif
