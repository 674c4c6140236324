/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_GROW_H
#define FLX_RESOLVER_GROW_H

#include <stddef.h>
#include <stdint.h>

/**
 * Make *arr (of *cap elements of elem bytes) hold at least need elements,
 * doubling its capacity.  *arr and *cap are updated only on success.
 * @return 0 or -ENOMEM (also when the byte size would overflow).
 */
int flx_grow(void **arr, size_t *cap, size_t need, size_t elem);

/** Sort v[0..n) ascending and drop repeats.  @return the new length. */
size_t flx_u32_sort_unique(uint32_t *v, size_t n);

#endif
