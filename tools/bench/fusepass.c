/* SPDX-License-Identifier: MIT */
/*
 * flexfs-fusepass: the FUSE limit of the benchmark.  A minimal read-only
 * low-level FUSE passthrough of a directory tree, with the data path
 * settings of flexfs (fs/fuse_ll.c): the same libfuse, the same request
 * size (max_write capped so that a reply fits a pipe), spliced replies
 * (SPLICE_WRITE without SPLICE_MOVE, FUSE_BUF_IS_FD), keep_cache on every open,
 * no auto_inval_data, max_background 64, the multi-threaded loop.  The
 * bdi readahead is set by the benchmark to the value flexfs sets.  Every
 * read is one pread-free splice of the backing file: no work per request
 * beyond libfuse's, which is what makes it the limit.
 *
 *   flexfs-fusepass DIR MOUNTPOINT [-f] [-o opts]
 *
 * The tree is scanned once at start (the benchmark's files never change).
 * Not installed; built for tools/bench only.
 *
 * FLEXFS_FUSEPASS_PASSTHROUGH=1: a prototype of the kernel's
 * FUSE_PASSTHROUGH (Linux >= 6.9) written against the kernel ABI, since
 * Debian 12's libfuse 3.14 has no API for it (3.17 does): the INIT reply
 * and each open reply are patched on their way to /dev/fuse (a custom
 * writev, as fs/fuse_ll.c patches INIT for direct_io mmap), and each file
 * is registered with FUSE_DEV_IOC_BACKING_OPEN.  Reads and mmap of an
 * opened file then go to the backing file inside the kernel.
 *
 * FLEXFS_FUSEPASS_URING=1: a prototype of the kernel's FUSE-over-io_uring
 * transport (Linux >= 6.14, CONFIG_FUSE_IO_URING, the fuse module's
 * enable_uring parameter on at mount time), written against the kernel ABI
 * with raw io_uring syscalls since libfuse 3.14 has none (3.18 does): the
 * INIT reply is patched to carry FUSE_OVER_IO_URING, then one thread per
 * possible CPU (the kernel's queue of a request is the CPU of its caller)
 * registers FP_URING_DEPTH entries (FUSE_IO_URING_CMD_REGISTER: a header
 * and a payload buffer) and answers each request it gets with
 * FUSE_IO_URING_CMD_COMMIT_AND_FETCH.  Once every queue has an entry the
 * kernel sends every request but FORGET and INTERRUPT through the rings;
 * libfuse's loop serves what comes before and those two.  A ring read is
 * one pread into the entry's payload buffer (the kernel copies it into the
 * page cache): no splice.  The reads served each way are printed at exit.
 *
 * FLEXFS_FUSEPASS_NOOPEN=1: the first OPEN of a file is answered ENOSYS,
 * after which the kernel sends no OPEN or RELEASE for files at all
 * (FUSE_NO_OPEN_SUPPORT, Linux >= 3.14; such opens keep the page cache)
 * and reads come with fh 0: they use one descriptor per node, opened at
 * the first read.  What an open round trip costs a loader that opens many
 * files (np.load opens each .npy twice).  Not with FLEXFS_FUSEPASS_URING.
 */
#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#ifdef FP_HAVE_URING_CMD
#include <linux/io_uring.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define FP_REQ_MAX	  (1u << 20)
#define FP_PAGE		  4096u
#define FP_SPLICE_PIECES  4u
#define FP_MAX_BACKGROUND 64u
#define FP_MAX_NODES	  65536u

typedef struct {
	fuse_ino_t parent;
	char *name;
	char *path;
	struct stat st;
	int32_t bid; /* passthrough: the backing id, registered at first open */
	int fd1; /* no-open: the node's descriptor + 1, 0 before its first read
		  */
} fp_node;

/* The kernel ABI of passthrough (include/uapi/linux/fuse.h, 7.40), absent
 * from Debian 12's headers. */
#define FP_FUSE_PASSTHROUGH_FLAGS2 (1u << (37 - 32))
#define FP_FOPEN_PASSTHROUGH	   (1u << 7)
#define FP_FUSE_INIT_EXT	   (1u << 30)
struct fp_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};
#define FP_IOC_BACKING_OPEN _IOW(229, 1, struct fp_backing_map)
struct fp_init_out { /* fuse_init_out, 7.40 */
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2, max_stack_depth;
	uint32_t unused[6];
};
struct fp_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};

/* The kernel ABI of FUSE over io_uring (include/uapi/linux/fuse.h, 7.42). */
#define FP_FUSE_OVER_IO_URING_FLAGS2  (1u << (41 - 32))
#define FP_URING_CMD_REGISTER	      1u
#define FP_URING_CMD_COMMIT_AND_FETCH 2u
struct fp_uring_ent_in_out {
	uint64_t flags, commit_id;
	uint32_t payload_sz, padding;
	uint64_t reserved;
};
struct fp_uring_req_header {
	char in_out[128]; /* fuse_in_header, then fuse_out_header */
	char op_in[128];  /* the first argument of the request */
	struct fp_uring_ent_in_out ent;
};
struct fp_uring_cmd_req { /* the 80-byte command area of a 128-byte SQE */
	uint64_t flags, commit_id;
	uint16_t qid;
	uint8_t padding[6];
};
#define FP_URING_DEPTH	 8u
#define FP_URING_PAYLOAD FP_REQ_MAX /* >= the kernel's max_pages * page */
#define FP_MAX_QUEUES	 256u

static int uring;			    /* FLEXFS_FUSEPASS_URING=1 */
static unsigned long ring_reads, dev_reads; /* READs served each way */
static pthread_mutex_t go_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go_cond = PTHREAD_COND_INITIALIZER;
static int go; /* 1: INIT answered, the rings may register; -1: exiting */
static int passthrough;		       /* FLEXFS_FUSEPASS_PASSTHROUGH=1 */
static int noopen;		       /* FLEXFS_FUSEPASS_NOOPEN=1 */
static int init_seen;		       /* the INIT reply was patched */
static int devfd = -1;		       /* /dev/fuse */
static _Thread_local int32_t open_bid; /* backing id of this thread's open */
static pthread_mutex_t bid_lock = PTHREAD_MUTEX_INITIALIZER;

static fp_node nodes[FP_MAX_NODES]; /* ino = index + 1; 1 is the root */
static unsigned n_nodes;

static int scan(const char *path, fuse_ino_t parent, const char *name)
{
	fp_node *n;
	DIR *d;
	struct dirent *de;
	fuse_ino_t ino;
	int rc = 0;

	if (n_nodes == FP_MAX_NODES)
		return -ENOSPC;
	n = &nodes[n_nodes];
	if (stat(path, &n->st))
		return -errno;
	n->parent = parent;
	n->name = strdup(name);
	n->path = strdup(path);
	if (!n->name || !n->path)
		return -ENOMEM;
	ino = ++n_nodes;
	n->st.st_ino = ino;
	if (!S_ISDIR(n->st.st_mode))
		return 0;
	d = opendir(path);
	if (!d)
		return -errno;
	while (!rc && (de = readdir(d))) {
		char sub[4096];

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name) >=
		    (int)sizeof(sub)) {
			rc = -ENAMETOOLONG;
			break;
		}
		rc = scan(sub, ino, de->d_name);
	}
	closedir(d);
	return rc;
}

/* Reply writer: patches INIT (passthrough, stack depth 1) and the open
 * reply of a file registered by this thread (FOPEN_PASSTHROUGH). */
static ssize_t fp_writev(int fd, struct iovec *iov, int count, void *ud)
{
	struct fp_init_out in;
	struct fp_open_out oo;
	struct iovec v[2];

	(void)ud;
	if (count == 2 && iov[1].iov_len == sizeof(in) &&
	    !__atomic_exchange_n(&init_seen, 1, __ATOMIC_ACQ_REL)) {
		ssize_t n;

		memcpy(&in, iov[1].iov_base, sizeof(in));
		in.flags |= FP_FUSE_INIT_EXT;
		if (passthrough) {
			in.flags2 |= FP_FUSE_PASSTHROUGH_FLAGS2;
			in.max_stack_depth = 1;
		}
		if (uring)
			in.flags2 |= FP_FUSE_OVER_IO_URING_FLAGS2;
		v[0] = iov[0];
		v[1] = (struct iovec){.iov_base = &in, .iov_len = sizeof(in)};
		n = writev(fd, v, 2);
		/* the kernel has processed the reply: rings may register */
		pthread_mutex_lock(&go_lock);
		if (!go)
			go = n > 0 ? 1 : -1;
		pthread_cond_broadcast(&go_cond);
		pthread_mutex_unlock(&go_lock);
		return n;
	}
	if (open_bid > 0 && count == 2 && iov[1].iov_len == sizeof(oo)) {
		memcpy(&oo, iov[1].iov_base, sizeof(oo));
		oo.open_flags |= FP_FOPEN_PASSTHROUGH;
		oo.backing_id = open_bid;
		open_bid = 0;
		v[0] = iov[0];
		v[1] = (struct iovec){.iov_base = &oo, .iov_len = sizeof(oo)};
		return writev(fd, v, 2);
	}
	return writev(fd, iov, count);
}

static ssize_t fp_readfd(int fd, void *buf, size_t len, void *ud)
{
	(void)ud;
	return read(fd, buf, len);
}

static ssize_t fp_splice(int fdin, off_t *offin, int fdout, off_t *offout,
			 size_t len, unsigned int flags, void *ud)
{
	(void)ud;
	return splice(fdin, offin, fdout, offout, len, flags);
}

static fp_node *node(fuse_ino_t ino)
{
	return ino >= 1 && ino <= n_nodes ? &nodes[ino - 1] : NULL;
}

/* Same request size rule as flexfs (fs/fuse_ll.c, probe_pipe()). */
static unsigned req_size(void)
{
	unsigned long v = 0;
	FILE *f;
	int p[2];

	if (pipe(p) == 0) {
		int ok = fcntl(p[0], F_SETPIPE_SZ, 2 * FP_REQ_MAX) > 0;

		close(p[0]);
		close(p[1]);
		if (ok)
			return FP_REQ_MAX;
	}
	f = fopen("/proc/sys/fs/pipe-max-size", "r");
	if (!f || fscanf(f, "%lu", &v) != 1)
		v = FP_REQ_MAX;
	if (f)
		fclose(f);
	v = v > FP_PAGE * (FP_SPLICE_PIECES + 3) + 16
		? v - (FP_PAGE * (FP_SPLICE_PIECES + 2) + 16)
		: FP_PAGE;
	v = v < FP_REQ_MAX ? v : FP_REQ_MAX;
	return (unsigned)(v / FP_PAGE * FP_PAGE);
}

static void fp_init(void *userdata, struct fuse_conn_info *conn)
{
	unsigned req = req_size();

	(void)userdata;
	if (conn->max_write > req)
		conn->max_write = req;
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	/* Not moved, as in flexfs: a moved page leaves the backing file's
	 * page cache, which is the floor's own copy here. */
	conn->want &= ~FUSE_CAP_SPLICE_MOVE;
	if (conn->max_background < FP_MAX_BACKGROUND)
		conn->max_background = FP_MAX_BACKGROUND;
	fprintf(stderr, "flexfs-fusepass: max_write %u\n", conn->max_write);
}

static void fp_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	unsigned i;

	for (i = 0; i < n_nodes; i++) {
		if (nodes[i].parent != parent || strcmp(nodes[i].name, name))
			continue;
		memset(&e, 0, sizeof(e));
		e.ino = i + 1;
		e.attr = nodes[i].st;
		e.attr_timeout = 86400.0;
		e.entry_timeout = 86400.0;
		fuse_reply_entry(req, &e);
		return;
	}
	fuse_reply_err(req, ENOENT);
}

static void fp_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	fp_node *n = node(ino);

	(void)fi;
	if (!n)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &n->st, 86400.0);
}

static void fp_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	fp_node *n = node(ino);
	int fd;

	if (!n || S_ISDIR(n->st.st_mode)) {
		fuse_reply_err(req, n ? EISDIR : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (noopen) {
		fuse_reply_err(req, ENOSYS); /* this open goes on without fh */
		return;
	}
	fd = open(n->path, O_RDONLY);
	if (fd < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	fi->fh = (uint64_t)fd;
	fi->keep_cache = 1;
	if (passthrough) {
		struct fp_backing_map map = {.fd = fd};
		int id;

		pthread_mutex_lock(&bid_lock);
		id = n->bid ? n->bid : ioctl(devfd, FP_IOC_BACKING_OPEN, &map);
		if (id > 0)
			n->bid = id;
		pthread_mutex_unlock(&bid_lock);
		if (id <= 0) {
			int e = errno;

			fprintf(stderr, "flexfs-fusepass: BACKING_OPEN: %s\n",
				strerror(e));
			close(fd);
			fuse_reply_err(req, e);
			return;
		}
		/* The opener looks the id up after this reply, and every
		 * open of an inode must name the same backing file: one id per
		 * node, kept for the mount's life. */
		open_bid = n->bid;
		fi->keep_cache = 0;
		if (fuse_reply_open(req, fi))
			close(fd);
		open_bid = 0;
		return;
	}
	if (fuse_reply_open(req, fi))
		close(fd);
}

static void fp_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);

	int fd = (int)fi->fh;

	__atomic_add_fetch(&dev_reads, 1, __ATOMIC_RELAXED);
	if (noopen) {
		fp_node *n = node(ino);

		pthread_mutex_lock(&bid_lock);
		if (n && !n->fd1)
			n->fd1 = open(n->path, O_RDONLY) + 1;
		fd = n ? n->fd1 - 1 : -1;
		pthread_mutex_unlock(&bid_lock);
		if (fd < 0) {
			fuse_reply_err(req, n ? EIO : ENOENT);
			return;
		}
	}
	bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	bv.buf[0].fd = fd;
	bv.buf[0].pos = off;
	fuse_reply_data(req, &bv, 0);
}

static void fp_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	(void)ino;
	close((int)fi->fh);
	fuse_reply_err(req, 0);
}

static void fp_opendir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	fp_node *n = node(ino);

	if (!n || !S_ISDIR(n->st.st_mode)) {
		fuse_reply_err(req, n ? ENOTDIR : ENOENT);
		return;
	}
	fi->keep_cache = 1;
	fi->cache_readdir = 1;
	fuse_reply_open(req, fi);
}

static void fp_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	char *buf = malloc(size);
	size_t used = 0;
	unsigned i;

	(void)fi;
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* offsets: the node index + 1 of the entry after the one returned */
	for (i = (unsigned)off; i < n_nodes; i++) {
		size_t len;

		if (nodes[i].parent != ino)
			continue;
		len = fuse_add_direntry(req, buf + used, size - used,
					nodes[i].name, &nodes[i].st,
					(off_t)i + 1);
		if (len > size - used)
			break;
		used += len;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

#ifdef FP_HAVE_URING_CMD
/* ---- FUSE over io_uring (FLEXFS_FUSEPASS_URING=1) ---- */

typedef struct {
	int fd;
	unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
	unsigned *cq_head, *cq_tail, *cq_mask;
	char *sqes; /* 128-byte entries (IORING_SETUP_SQE128) */
	struct io_uring_cqe *cqes;
	unsigned pending; /* SQEs queued, not yet submitted */
} fp_ring;

typedef struct {
	struct fp_uring_req_header hdr;
	struct iovec iov[2];
} fp_ent;

static int ring_setup(fp_ring *r, unsigned entries)
{
	struct io_uring_params p;
	size_t sq_sz, cq_sz;
	char *sq, *cq;

	memset(&p, 0, sizeof(p));
	p.flags = IORING_SETUP_SQE128;
	r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
	if (r->fd < 0)
		return -errno;
	sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	if (!(p.features & IORING_FEAT_SINGLE_MMAP))
		return -ENOSYS;
	sq_sz = sq_sz > cq_sz ? sq_sz : cq_sz;
	sq = mmap(NULL, sq_sz, PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
	if (sq == MAP_FAILED)
		return -errno;
	cq = sq;
	r->sqes = mmap(NULL, p.sq_entries * 128, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
	if (r->sqes == MAP_FAILED)
		return -errno;
	r->sq_head = (unsigned *)(sq + p.sq_off.head);
	r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
	r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
	r->sq_array = (unsigned *)(sq + p.sq_off.array);
	r->cq_head = (unsigned *)(cq + p.cq_off.head);
	r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
	r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
	r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
	r->pending = 0;
	return 0;
}

/* Queue one uring command for entry i (each entry has at most one in
 * flight, and the SQ holds every entry: no overflow). */
static void ring_cmd(fp_ring *r, fp_ent *e, unsigned i, unsigned op,
		     unsigned qid)
{
	unsigned tail = *r->sq_tail, idx = tail & *r->sq_mask;
	struct io_uring_sqe *sqe = (struct io_uring_sqe *)(r->sqes + 128 * idx);
	struct fp_uring_cmd_req cr;

	memset(sqe, 0, 128);
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = devfd;
	sqe->cmd_op = op;
	sqe->addr = (uint64_t)(uintptr_t)e->iov;
	sqe->len = 2;
	sqe->user_data = i;
	memset(&cr, 0, sizeof(cr));
	cr.qid = (uint16_t)qid;
	cr.commit_id = e->hdr.ent.commit_id;
	memcpy(sqe->cmd, &cr, sizeof(cr));
	r->sq_array[idx] = idx;
	__atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
	r->pending++;
}

static void fill_attr(struct fuse_attr *a, const struct stat *st)
{
	memset(a, 0, sizeof(*a));
	a->ino = st->st_ino;
	a->size = (uint64_t)st->st_size;
	a->blocks = (uint64_t)st->st_blocks;
	a->atime = (uint64_t)st->st_atim.tv_sec;
	a->mtime = (uint64_t)st->st_mtim.tv_sec;
	a->ctime = (uint64_t)st->st_ctim.tv_sec;
	a->mode = st->st_mode;
	a->nlink = (uint32_t)st->st_nlink;
	a->uid = st->st_uid;
	a->gid = st->st_gid;
	a->blksize = (uint32_t)st->st_blksize;
}

static int ring_lookup(const struct fuse_in_header *ih, char *pl, size_t insz,
		       size_t *out)
{
	struct fuse_entry_out eo;
	unsigned i;

	if (!insz || pl[insz - 1])
		return -EINVAL;
	for (i = 0; i < n_nodes; i++) {
		if (nodes[i].parent != ih->nodeid || strcmp(nodes[i].name, pl))
			continue;
		memset(&eo, 0, sizeof(eo));
		eo.nodeid = i + 1;
		eo.entry_valid = eo.attr_valid = 86400;
		fill_attr(&eo.attr, &nodes[i].st);
		memcpy(pl, &eo, sizeof(eo));
		*out = sizeof(eo);
		return 0;
	}
	return -ENOENT;
}

static int ring_open(const fp_node *n, const void *op, char *pl, size_t *out,
		     int dir)
{
	struct fuse_open_in oi;
	struct fuse_open_out oo;
	int fd = 0;

	memcpy(&oi, op, sizeof(oi));
	if (!S_ISDIR(n->st.st_mode) != !dir)
		return dir ? -ENOTDIR : -EISDIR;
	if ((oi.flags & O_ACCMODE) != O_RDONLY)
		return -EROFS;
	if (!dir && (fd = open(n->path, O_RDONLY)) < 0)
		return -errno;
	memset(&oo, 0, sizeof(oo));
	oo.fh = (uint64_t)fd;
	oo.open_flags = FOPEN_KEEP_CACHE | (dir ? FOPEN_CACHE_DIR : 0);
	memcpy(pl, &oo, sizeof(oo));
	*out = sizeof(oo);
	return 0;
}

static int ring_read(const void *op, char *pl, size_t *out)
{
	struct fuse_read_in ri;
	size_t got = 0, want;

	memcpy(&ri, op, sizeof(ri));
	want = ri.size < FP_URING_PAYLOAD ? ri.size : FP_URING_PAYLOAD;
	while (got < want) {
		ssize_t n = pread((int)ri.fh, pl + got, want - got,
				  (off_t)(ri.offset + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (!n)
			break;
		got += (size_t)n;
	}
	__atomic_add_fetch(&ring_reads, 1, __ATOMIC_RELAXED);
	*out = got;
	return 0;
}

/* Entries of the same offsets as fp_readdir(). */
static int ring_readdir(fuse_ino_t ino, const void *op, char *pl, size_t *out)
{
	struct fuse_read_in ri;
	size_t used = 0, cap;
	unsigned i;

	memcpy(&ri, op, sizeof(ri));
	cap = ri.size < FP_URING_PAYLOAD ? ri.size : FP_URING_PAYLOAD;
	for (i = (unsigned)ri.offset; i < n_nodes; i++) {
		struct fuse_dirent *d = (struct fuse_dirent *)(pl + used);
		size_t nl = strlen(nodes[i].name);
		size_t len = FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET + nl);

		if (nodes[i].parent != ino)
			continue;
		if (len > cap - used)
			break;
		memset(d, 0, len);
		d->ino = i + 1;
		d->off = i + 1;
		d->namelen = (uint32_t)nl;
		d->type = (nodes[i].st.st_mode & S_IFMT) >> 12;
		memcpy(d->name, nodes[i].name, nl);
		used += len;
	}
	*out = used;
	return 0;
}

/* Serve the request in entry e; write the reply header and its size. */
static void ring_serve(fp_ent *e)
{
	struct fuse_in_header ih;
	struct fuse_out_header oh;
	const void *op = e->hdr.op_in;
	char *pl = e->iov[1].iov_base;
	size_t out = 0;
	fp_node *n;
	int err = 0;

	memcpy(&ih, e->hdr.in_out, sizeof(ih));
	n = node(ih.nodeid);
	if (!n && ih.opcode != FUSE_LOOKUP)
		err = -ENOENT;
	else if (ih.opcode == FUSE_LOOKUP)
		err = ring_lookup(&ih, pl, e->hdr.ent.payload_sz, &out);
	else if (ih.opcode == FUSE_GETATTR) {
		struct fuse_attr_out ao;

		memset(&ao, 0, sizeof(ao));
		ao.attr_valid = 86400;
		fill_attr(&ao.attr, &n->st);
		memcpy(pl, &ao, sizeof(ao));
		out = sizeof(ao);
	} else if (ih.opcode == FUSE_OPEN || ih.opcode == FUSE_OPENDIR)
		err = ring_open(n, op, pl, &out, ih.opcode == FUSE_OPENDIR);
	else if (ih.opcode == FUSE_READ)
		err = ring_read(op, pl, &out);
	else if (ih.opcode == FUSE_READDIR)
		err = ring_readdir(ih.nodeid, op, pl, &out);
	else if (ih.opcode == FUSE_RELEASE) {
		struct fuse_release_in rl;

		memcpy(&rl, op, sizeof(rl));
		close((int)rl.fh);
	} else if (ih.opcode == FUSE_STATFS) {
		struct fuse_statfs_out so;

		memset(&so, 0, sizeof(so));
		so.st.bsize = so.st.frsize = FP_PAGE;
		so.st.namelen = 255;
		memcpy(pl, &so, sizeof(so));
		out = sizeof(so);
	} else if (ih.opcode != FUSE_FLUSH && ih.opcode != FUSE_RELEASEDIR)
		err = -ENOSYS;
	memset(&oh, 0, sizeof(oh));
	oh.unique = ih.unique;
	oh.error = err;
	oh.len = (uint32_t)(sizeof(oh) + (err ? 0 : out));
	memcpy(e->hdr.in_out, &oh, sizeof(oh));
	e->hdr.ent.payload_sz = err ? 0 : (uint32_t)out;
}

static void ring_report(int qid, const char *what, int err)
{
	if (err == -ENOTCONN || err == -ECONNABORTED || err == -ECANCELED ||
	    err == -ENODEV)
		return; /* unmounted */
	fprintf(stderr, "flexfs-fusepass: io_uring queue %d: %s: %s\n", qid,
		what, strerror(-err));
}

/* One queue: register FP_URING_DEPTH entries, then commit and fetch. */
static void *ring_main(void *arg)
{
	unsigned qid = (unsigned)(uintptr_t)arg, i;
	fp_ent *ents = NULL;
	fp_ring r;
	cpu_set_t cs;
	int rc;

	pthread_mutex_lock(&go_lock);
	while (!go)
		pthread_cond_wait(&go_cond, &go_lock);
	rc = go;
	pthread_mutex_unlock(&go_lock);
	if (rc < 0)
		return NULL;
	CPU_ZERO(&cs);
	CPU_SET(qid, &cs);
	pthread_setaffinity_np(pthread_self(), sizeof(cs), &cs);
	rc = ring_setup(&r, 2 * FP_URING_DEPTH);
	if (rc) {
		ring_report((int)qid, "io_uring_setup", rc);
		return NULL;
	}
	ents = calloc(FP_URING_DEPTH, sizeof(*ents));
	if (!ents)
		return NULL;
	for (i = 0; i < FP_URING_DEPTH; i++) {
		void *pl = NULL;

		if (posix_memalign(&pl, FP_PAGE, FP_URING_PAYLOAD))
			return NULL;
		ents[i].iov[0] =
		    (struct iovec){&ents[i].hdr, sizeof(ents[i].hdr)};
		ents[i].iov[1] = (struct iovec){pl, FP_URING_PAYLOAD};
		ring_cmd(&r, &ents[i], i, FP_URING_CMD_REGISTER, qid);
	}
	for (;;) {
		unsigned head, tail;

		rc = (int)syscall(__NR_io_uring_enter, r.fd, r.pending, 1,
				  IORING_ENTER_GETEVENTS, NULL, 0);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0) {
			ring_report((int)qid, "io_uring_enter", -errno);
			return NULL;
		}
		r.pending -= (unsigned)rc;
		head = *r.cq_head;
		tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
		for (; head != tail; head++) {
			struct io_uring_cqe *c = &r.cqes[head & *r.cq_mask];
			fp_ent *e = &ents[c->user_data];

			if (c->res < 0) {
				ring_report((int)qid,
					    "FUSE_IO_URING_CMD_REGISTER or "
					    "COMMIT_AND_FETCH",
					    c->res);
				return NULL;
			}
			ring_serve(e);
			ring_cmd(&r, e, (unsigned)c->user_data,
				 FP_URING_CMD_COMMIT_AND_FETCH, qid);
		}
		__atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
	}
}
#endif

static const struct fuse_lowlevel_ops fp_ops = {
    .init = fp_init,
    .lookup = fp_lookup,
    .getattr = fp_getattr,
    .open = fp_open,
    .read = fp_read,
    .release = fp_release,
    .opendir = fp_opendir,
    .readdir = fp_readdir,
};

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc - 1, argv + 1);
	struct fuse_cmdline_opts fo;
	struct fuse_session *se = NULL;
	struct fuse_loop_config *cfg = NULL;
	char *dir = NULL;
	int rc = 1;

	/* DIR first, then what fuse_parse_cmdline() knows */
	if (argc < 3) {
		fprintf(stderr, "usage: %s DIR MOUNTPOINT [-f] [-o opts]\n",
			argv[0]);
		return 2;
	}
	dir = realpath(argv[1], NULL);
	args.argv[0] = argv[0];
	if (!dir || fuse_parse_cmdline(&args, &fo) || !fo.mountpoint) {
		fprintf(stderr, "flexfs-fusepass: bad arguments\n");
		goto out;
	}
	if (scan(dir, 0, "") || !S_ISDIR(nodes[0].st.st_mode)) {
		fprintf(stderr, "flexfs-fusepass: cannot scan %s\n", dir);
		goto out;
	}
	fuse_opt_add_arg(&args, "-oro,default_permissions");
	se = fuse_session_new(&args, &fp_ops, sizeof(fp_ops), NULL);
	if (!se || fuse_session_mount(se, fo.mountpoint))
		goto out;
	passthrough = getenv("FLEXFS_FUSEPASS_PASSTHROUGH") &&
		      !strcmp(getenv("FLEXFS_FUSEPASS_PASSTHROUGH"), "1");
	uring = getenv("FLEXFS_FUSEPASS_URING") &&
		!strcmp(getenv("FLEXFS_FUSEPASS_URING"), "1");
	noopen = getenv("FLEXFS_FUSEPASS_NOOPEN") &&
		 !strcmp(getenv("FLEXFS_FUSEPASS_NOOPEN"), "1");
	if (noopen && (uring || passthrough)) {
		fprintf(stderr, "flexfs-fusepass: NOOPEN goes with neither "
				"URING nor PASSTHROUGH\n");
		goto unmount;
	}
	if (passthrough || uring) {
		static const struct fuse_custom_io io = {
		    .writev = fp_writev,
		    .read = fp_readfd,
		    .splice_receive = fp_splice,
		    .splice_send = fp_splice,
		};

		devfd = fuse_session_fd(se);
		if (fuse_session_custom_io(se, &io, devfd))
			goto unmount;
	}
	if (fuse_daemonize(fo.foreground))
		goto unmount;
#ifndef FP_HAVE_URING_CMD
	if (uring) {
		fprintf(stderr, "flexfs-fusepass: io_uring: not built (kernel "
				"headers without uring_cmd)\n");
		goto unmount;
	}
#else
	if (uring) {
		long q, nq = sysconf(_SC_NPROCESSORS_CONF);

		for (q = 0; q < nq && q < (long)FP_MAX_QUEUES; q++) {
			pthread_t t;

			if (pthread_create(&t, NULL, ring_main, (void *)q))
				goto unmount;
			pthread_detach(t);
		}
	}
#endif
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		goto unmount;
	fuse_loop_cfg_set_clone_fd(cfg, fo.clone_fd);
	fuse_loop_cfg_set_max_threads(cfg, fo.max_threads);
	rc = fuse_session_loop_mt(se, cfg) ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);
	if (uring)
		fprintf(stderr,
			"flexfs-fusepass: reads served: %lu io_uring, %lu "
			"/dev/fuse\n",
			ring_reads, dev_reads);
unmount:
	fuse_session_unmount(se);
out:
	if (se)
		fuse_session_destroy(se);
	free(dir);
	fuse_opt_free_args(&args);
	return rc;
}
