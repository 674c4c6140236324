/* SPDX-License-Identifier: MIT */
/*
 * flexfs-materialize's collectives (mat_comm.h): MPI when built with it
 * (FLX_HAVE_MPI) and launched by mpirun, otherwise world size 1.
 */
#include "mat_comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FLX_HAVE_MPI
#include <mpi.h>

/* Whether a launcher started this process: without one, MPI_Init would
 * start a singleton runtime (slow, and it fails where no launcher can
 * run), for a world of one process we serve ourselves. */
static bool launched(void)
{
	return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") ||
	       getenv("PMI_RANK");
}
#endif

int flx_comm_init(int *argc, char ***argv, flx_comm *c)
{
	memset(c, 0, sizeof(*c));
	c->size = 1;
#ifdef FLX_HAVE_MPI
	if (launched()) {
		if (MPI_Init(argc, argv) != MPI_SUCCESS) {
			fprintf(stderr,
				"flexfs-materialize: MPI_Init failed\n");
			return -EIO;
		}
		c->mpi = true;
		MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
		MPI_Comm_size(MPI_COMM_WORLD, &c->size);
		c->req = malloc(sizeof(MPI_Request));
		if (!c->req) {
			MPI_Finalize();
			c->mpi = false;
			return -ENOMEM;
		}
	}
#else
	(void)argc;
	(void)argv;
#endif
	return 0;
}

const char *flx_comm_kind(const flx_comm *c, char *buf, unsigned len)
{
	if (c->mpi)
		snprintf(buf, len, "MPI, %d rank%s", c->size,
			 c->size == 1 ? "" : "s");
	else
		snprintf(buf, len, "1 process");
	return buf;
}

int flx_comm_agree(flx_comm *c, int rc, int *all)
{
	*all = rc;
#ifdef FLX_HAVE_MPI
	if (c->mpi && MPI_Allreduce(&rc, all, 1, MPI_INT, MPI_MIN,
				    MPI_COMM_WORLD) != MPI_SUCCESS)
		return -EIO;
#else
	(void)c;
#endif
	return 0;
}

int flx_comm_start(flx_comm *c, const uint64_t *in)
{
	memcpy(c->in, in, sizeof(c->in));
	c->pending = true;
#ifdef FLX_HAVE_MPI
	if (c->mpi && MPI_Iallreduce(c->in, c->out, FLX_COMM_N, MPI_UINT64_T,
				     MPI_SUM, MPI_COMM_WORLD,
				     (MPI_Request *)c->req) != MPI_SUCCESS)
		return -EIO;
	if (c->mpi)
		return 0;
#endif
	memcpy(c->out, c->in, sizeof(c->out));
	return 0;
}

int flx_comm_test(flx_comm *c, bool *done, uint64_t *out)
{
	*done = true;
#ifdef FLX_HAVE_MPI
	if (c->mpi && c->pending) {
		int flag = 0;

		if (MPI_Test((MPI_Request *)c->req, &flag, MPI_STATUS_IGNORE) !=
		    MPI_SUCCESS)
			return -EIO;
		*done = flag != 0;
	}
#endif
	if (*done) {
		c->pending = false;
		memcpy(out, c->out, sizeof(c->out));
	}
	return 0;
}

void flx_comm_end(flx_comm *c)
{
#ifdef FLX_HAVE_MPI
	if (c->mpi)
		MPI_Finalize();
	free(c->req);
#endif
	c->mpi = false;
	c->req = NULL;
}
