/* SPDX-License-Identifier: MIT */
#ifndef FLX_TOOLS_MAT_COMM_H
#define FLX_TOOLS_MAT_COMM_H

/*
 * The few collective operations flexfs-materialize needs, over MPI when
 * it was built with OpenMPI and started by a launcher (mpirun), and
 * trivially over one process otherwise: the caller runs the same code
 * with world size 1.  Every rank must make the same sequence of
 * collective calls (flx_comm_agree(), flx_comm_start()).
 *
 * Thread-safety: one thread per process calls these.
 */

#include <stdbool.h>
#include <stdint.h>

/* Counters summed over the ranks by flx_comm_start()/flx_comm_test(). */
#define FLX_COMM_N 8

typedef struct flx_comm {
	int rank, size;
	bool mpi;		  /* MPI_Init ran: flx_comm_end() finalizes */
	bool pending;		  /* a sum is in flight */
	uint64_t in[FLX_COMM_N];  /* its input (kept until it completes) */
	uint64_t out[FLX_COMM_N]; /* its result */
	void *req;		  /* MPI_Request, when mpi */
} flx_comm;

/**
 * Join the world: MPI's when a launcher started this process (its
 * environment says so) and MPI is built in, otherwise one process.
 * @return 0 and *c, or -EIO (MPI_Init failed; a line on stderr).
 */
int flx_comm_init(int *argc, char ***argv, flx_comm *c);

/** A description of the world for messages ("MPI, 4 ranks", "1 process"). */
const char *flx_comm_kind(const flx_comm *c, char *buf, unsigned len);

/**
 * Collective: every rank's rc in, the most negative of them out in *all
 * (0 when every rank succeeded), so that all stop together.
 * @return 0, or -EIO (MPI failed).
 */
int flx_comm_agree(flx_comm *c, int rc, int *all);

/**
 * Collective, non-blocking: start summing in[0..FLX_COMM_N) over the
 * ranks (no other sum may be in flight).  @return 0 or -EIO.
 */
int flx_comm_start(flx_comm *c, const uint64_t *in);

/**
 * Whether the sum in flight completed: *done and out[0..FLX_COMM_N), or
 * *done false (call again; each call lets MPI progress).
 * @return 0 or -EIO.
 */
int flx_comm_test(flx_comm *c, bool *done, uint64_t *out);

/** Leave the world (MPI_Finalize when MPI_Init ran). */
void flx_comm_end(flx_comm *c);

#endif
