/* SPDX-License-Identifier: MIT */
/*
 * flexfs-fusepass: the FUSE limit of the benchmark.  A minimal read-only
 * low-level FUSE passthrough of a directory tree, with the data path
 * settings of flexfs (fs/fuse_ll.c): the same libfuse, the same request
 * size (max_write capped so that a reply fits a pipe), spliced replies
 * (SPLICE_WRITE | SPLICE_MOVE, FUSE_BUF_IS_FD), keep_cache on every open,
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
 */
#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
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

static int passthrough;		       /* FLEXFS_FUSEPASS_PASSTHROUGH=1 */
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
		memcpy(&in, iov[1].iov_base, sizeof(in));
		in.flags |= FP_FUSE_INIT_EXT;
		in.flags2 |= FP_FUSE_PASSTHROUGH_FLAGS2;
		in.max_stack_depth = 1;
		v[0] = iov[0];
		v[1] = (struct iovec){.iov_base = &in, .iov_len = sizeof(in)};
		return writev(fd, v, 2);
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
	if (conn->capable & FUSE_CAP_SPLICE_MOVE)
		conn->want |= FUSE_CAP_SPLICE_MOVE;
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

	(void)ino;
	bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	bv.buf[0].fd = (int)fi->fh;
	bv.buf[0].pos = off;
	fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
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
	if (passthrough) {
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
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		goto unmount;
	fuse_loop_cfg_set_clone_fd(cfg, fo.clone_fd);
	fuse_loop_cfg_set_max_threads(cfg, fo.max_threads);
	rc = fuse_session_loop_mt(se, cfg) ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);
unmount:
	fuse_session_unmount(se);
out:
	if (se)
		fuse_session_destroy(se);
	free(dir);
	fuse_opt_free_args(&args);
	return rc;
}
