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
 */
#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
} fp_node;

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

static void fp_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
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
