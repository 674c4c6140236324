/* SPDX-License-Identifier: MIT */
#ifndef FLX_TESTS_SYNTH_CKPT_H
#define FLX_TESTS_SYNTH_CKPT_H

/*
 * A synthetic checkpoint index for unit tests: tensors saved whole, one
 * chunk each, laid one after another in one data file whose bytes are
 * distinct (a view's bytes out of place show).  The caller builds it in
 * three steps: synth_ckpt_open(), synth_ckpt_whole() for every tensor in
 * order, synth_ckpt_fill(); then adds what its test needs (other files,
 * objects, a Paddle name table) and frees it with flx_ckpt_close().
 * Single-threaded, like the tests.
 */

#include "ckpt.h"

#include <stddef.h>
#include <stdint.h>

typedef struct synth_layout {
	const char *format; /* flx_ckpt.format */
	const char *writer; /* flx_ckpt.writer */
	const char
	    *data_file;	   /* created (truncated) in the directory: file 0 */
	uint32_t nfiles;   /* file slots, file 0 included (>= 1); the
			    * caller fills those past 0 */
	uint64_t first;	   /* where the first tensor's bytes start */
	unsigned mul, add; /* byte i of the data file: i * mul + add */
} synth_layout;

/* A checkpoint of ntensors empty tensor slots in dir, file 0 created.
 * @return 0 (*out owned by the caller) or -errno (nothing left open). */
int synth_ckpt_open(const char *dir, const synth_layout *l, size_t ntensors,
		    flx_ckpt **out);

/* Tensor i: fqn (copied), dtype, shape[0..ndim), saved whole and row-major
 * at *at in file 0; *at moves past its bytes and an 8-byte gap.
 * @return 0 or -ENOMEM. */
int synth_ckpt_whole(flx_ckpt *c, size_t i, const char *fqn, flx_dtype dt,
		     int ndim, const int64_t *shape, uint64_t *at);

/* File 0 sized to end and filled with the layout's bytes; its identity
 * recorded.  @return 0 or -errno. */
int synth_ckpt_fill(flx_ckpt *c, const synth_layout *l, uint64_t end);

#endif
