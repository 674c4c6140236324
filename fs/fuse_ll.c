/* SPDX-License-Identifier: MIT */
/*
 * Low-level FUSE operations: each callback translates one request into one
 * call on the namespace (tree.h) and replies.
 *
 * Inode scheme: a FUSE inode number IS the flx_ino of the node, and the
 * root is FLX_ROOT_INO == FUSE_ROOT_ID == 1.  The tree is built once before
 * mounting and never changes, so numbers are stable for the mount's life,
 * there is nothing to allocate on lookup and nothing to free on forget
 * (the kernel's lookup counts need no bookkeeping).  Negative lookups are
 * replied as entries with ino 0 so the kernel caches the miss too.
 *
 * Thread-safety: the session runs a multithreaded loop.  The namespace is
 * immutable after flx_fs_build() and every flx_fs_* call is reentrant;
 * flx_ll is read-only; callbacks keep all other state on the stack or in
 * per-thread buffers, but for the backing files' mappings (published once
 * each, atomically), the passthrough ids and the pusher's queue (locked).
 *
 * Caching: since nothing changes, entries and attributes are cached "for
 * ever", file pages are kept across opens (keep_cache) and directory
 * listings are cached (cache_readdir).  -o direct_io opens files
 * FOPEN_DIRECT_IO instead (see the block above flx_ll_writev()); -o
 * passthrough opens the files that are one backing file FOPEN_PASSTHROUGH
 * (the block above pass_get()).
 */
#include "fuse_ll.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/fuse.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/* About 31 years: "never expires" while staying far from the overflow
 * edge of the kernel's jiffies arithmetic. */
#define FLX_LL_TIMEOUT 1e9

#define FLX_LL_BSIZE 4096

/* One message of the mounted daemon: on stderr with -f, else to syslog;
 * and with -o log=FILE appended there too, one write() per line (whole
 * lines even from several threads, O_APPEND). */
static void emit(const flx_ll *ll, int prio, const char *msg)
{
	char line[1024], stamp[32];
	struct tm tm;
	time_t now;
	int n;

	if (ll->foreground)
		fprintf(stderr, "flexfs: %s\n", msg);
	else
		syslog(prio, "flexfs: %s", msg);
	if (ll->log_fd < 0)
		return;
	now = time(NULL);
	if (!gmtime_r(&now, &tm) ||
	    !strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm))
		stamp[0] = '\0';
	n = snprintf(line, sizeof(line), "%s flexfs[%ld]: %s\n", stamp,
		     (long)getpid(), msg);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line)) {
		n = sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	(void)!write(ll->log_fd, line, (size_t)n);
}

/* A file that fails (a backing file changed or vanished after mount) is
 * reported once, so a loader retrying every page cannot flood the log; the
 * other files keep being served.  The reason: the given one, else the
 * distributed mount's, else the backing file this thread found changed. */
static void log_once(const flx_ll *ll, fuse_ino_t ino, const char *op, int rc,
		     const char *reason)
{
	char path[1024], why[320] = "", msg[1400];

	if (!ll->logged || ino > flx_fs_inode_count(ll->fs) ||
	    __atomic_exchange_n(&ll->logged[ino], 1, __ATOMIC_RELAXED)) {
		flx_file_changed_why(why, 0); /* consumed either way */
		return;
	}
	if (flx_fs_path(ll->fs, ino, path, sizeof(path)))
		snprintf(path, sizeof(path), "inode %lu", (unsigned long)ino);
	if (reason)
		snprintf(why, sizeof(why), "%s", reason);
	if (!why[0] && ll->why)
		ll->why(ll->why_arg, why, sizeof(why));
	if (!why[0])
		flx_file_changed_why(why, sizeof(why));
	else
		flx_file_changed_why(msg, 0);
	if (!why[0])
		snprintf(why, sizeof(why),
			 "a backing file changed after mount?");
	snprintf(msg, sizeof(msg), "%s: %s failed: %s (%s)", path, op,
		 strerror(rc), why);
	emit(ll, LOG_ERR, msg);
}

/* A warning: the mount goes on. */
__attribute__((format(printf, 2, 3))) static void warn(const flx_ll *ll,
						       const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	emit(ll, LOG_WARNING, msg);
}

/*
 * direct_io.  A file opened FOPEN_DIRECT_IO has no page cache for read():
 * each read() is sent to the daemon and the reply lands in the reader's
 * buffer.  For a view that is one copy per byte instead of two (a spliced
 * reply goes from the backing file's page cache straight to the reader,
 * not through a page cache of the view) and no page-cache pages to
 * allocate, so large first reads are faster and the data is not cached
 * twice (backing file and view).  The price: re-reads are served by the
 * daemon again, and every small read() is a round trip, so it is an
 * option, not the default (docs/performance.md has the figures).
 *
 * Loaders mmap() these files (numpy's, and others).  A MAP_SHARED mapping
 * of a direct-io file fails with ENODEV unless the INIT reply carries
 * FUSE_DIRECT_IO_ALLOW_MMAP (protocol 7.39, Linux 6.6); the mapping then
 * goes through the page cache as usual.  libfuse 3.17 asks for it with
 * FUSE_CAP_DIRECT_IO_ALLOW_MMAP.  Older libfuse (Debian 12 has 3.14) can
 * neither ask for it nor pass it on: it writes its INIT reply itself.  So
 * the session's writes go through flx_ll_writev(), which adds the flag to
 * that one reply: the first write after flx_ll_init() has run, since the
 * kernel sends no other request until INIT is answered.  Where the kernel
 * is older, direct_io is dropped with a warning: mmap must keep working.
 */
#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36)
#endif
#define FLX_LL_DIO_MMAP_MINOR 39

/*
 * FUSE passthrough (protocol 7.40, Linux 6.9, CONFIG_FUSE_PASSTHROUGH):
 * the kernel ABI, which Debian 12's headers and libfuse 3.14 lack (3.17
 * has an API for it).  The INIT reply asks for it in flags2 with a stack
 * depth (the mount then stacks over its backing files: 1, files on a
 * plain filesystem); a backing file is registered on /dev/fuse for an id;
 * an open reply carrying FOPEN_PASSTHROUGH and that id makes the kernel
 * read the backing file for every read and mmap of the open file.
 */
#ifdef FUSE_PASSTHROUGH
#define FLX_LL_STACK_DEPTH(o) ((o)->max_stack_depth)
#define FLX_LL_BACKING_ID(o)  ((o)->backing_id)
#else
#define FUSE_PASSTHROUGH      (1ULL << 37)
#define FOPEN_PASSTHROUGH     (1u << 7)
#define FLX_LL_STACK_DEPTH(o) ((o)->unused[0])
#define FLX_LL_BACKING_ID(o)  ((o)->padding)
#endif
#ifndef FUSE_DEV_IOC_BACKING_OPEN
struct fuse_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};
#define FUSE_DEV_IOC_BACKING_OPEN  _IOW(229, 1, struct fuse_backing_map)
#define FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)
#endif
#define FLX_LL_PASS_MINOR 40

/* What the INIT reply must add (flx_ll.init_patch). */
#define FLX_LL_PATCH_DIO  1 /* FUSE_DIRECT_IO_ALLOW_MMAP */
#define FLX_LL_PATCH_PASS 2 /* FUSE_PASSTHROUGH, stack depth 1 */

/* An open file's fh: opened passthrough (released in flx_ll_release). */
#define FLX_LL_FH_PASS 1

/* The backing id an open reply of this thread is to carry (0: none). */
static _Thread_local int32_t reply_bid;

/*
 * Short replies.  A backing file that shrinks between the check before a
 * reply (flx_file_verify()) and the splice of its bytes makes the splice
 * end early; libfuse then sends the bytes it got as a short reply.  The
 * kernel takes a short read for the end of the file and shrinks the view:
 * a reader would see a shorter file, not an error.  So flx_ll_read()
 * notes the reply's full length for the thread, and a reply written or
 * spliced with another length is replaced by EIO (flx_ll_writev(),
 * flx_ll_splice_send()), logged once per mount.
 */
static _Thread_local size_t reply_expect;  /* header + bytes; 0: any */
static _Thread_local fuse_ino_t reply_ino; /* the file read */

static void send_eio(flx_ll *ll, int fd, uint64_t unique)
{
	struct fuse_out_header eh = {
	    .len = sizeof(eh), .error = -EIO, .unique = unique};

	(void)!write(fd, &eh, sizeof(eh));
	log_once(ll, reply_ino, "read", EIO,
		 "a backing file ended early while the reply was sent: "
		 "changed under the mount");
}

static ssize_t flx_ll_writev(int fd, struct iovec *iov, int count,
			     void *userdata)
{
	flx_ll *ll = userdata;
	const struct fuse_out_header *oh = iov[0].iov_base;
	struct fuse_init_out out;
	struct iovec patched[2];
	int patch;

	if (reply_expect && count > 0 && iov[0].iov_len >= sizeof(*oh) &&
	    oh->error == 0 && oh->len != reply_expect) {
		size_t len = oh->len;

		send_eio(ll, fd, oh->unique);
		return (ssize_t)len; /* libfuse needs no error of its own */
	}
	if (reply_expect && count > 0 && iov[0].iov_len >= sizeof(*oh) &&
	    oh->error == 0) {
		ssize_t n = writev(fd, iov, count);

		/* A reply from mapped backing files (send_mapped()) whose
		 * file was cut short: the kernel could not take the missing
		 * pages and has ended the request with EIO itself. */
		if (n < 0 && errno == EFAULT) {
			log_once(ll, reply_ino, "read", EIO,
				 "a backing file ended early while the reply "
				 "was sent: changed under the mount");
			return (ssize_t)oh->len;
		}
		return n;
	}
	if (reply_bid && count == 2 && iov[0].iov_len == sizeof(*oh) &&
	    oh->error == 0 && iov[1].iov_len == sizeof(struct fuse_open_out)) {
		struct fuse_open_out o;

		memcpy(&o, iov[1].iov_base, sizeof(o));
		o.open_flags |= FOPEN_PASSTHROUGH;
		FLX_LL_BACKING_ID(&o) = reply_bid;
		patched[0] = iov[0];
		patched[1] =
		    (struct iovec){.iov_base = &o, .iov_len = sizeof(o)};
		return writev(fd, patched, 2);
	}
	if (!__atomic_load_n(&ll->init_patch, __ATOMIC_ACQUIRE) ||
	    !(patch =
		  __atomic_exchange_n(&ll->init_patch, 0, __ATOMIC_ACQ_REL)))
		return writev(fd, iov, count);
	/* libfuse's INIT reply: header, then the whole fuse_init_out (the
	 * kernel is >= 7.39, so libfuse sends every field).  Anything else
	 * (an error reply: libfuse refused the connection) goes unchanged. */
	if (count != 2 || iov[0].iov_len != sizeof(*oh) || oh->error != 0 ||
	    iov[1].iov_len != sizeof(out))
		return writev(fd, iov, count);
	memcpy(&out, iov[1].iov_base, sizeof(out));
	out.flags |= FUSE_INIT_EXT; /* flags2 is read only with it */
	if (patch & FLX_LL_PATCH_DIO)
		out.flags2 |= (uint32_t)(FUSE_DIRECT_IO_ALLOW_MMAP >> 32);
	if (patch & FLX_LL_PATCH_PASS) {
		out.flags2 |= (uint32_t)(FUSE_PASSTHROUGH >> 32);
		FLX_LL_STACK_DEPTH(&out) = 1;
	}
	patched[0] = iov[0];
	patched[1] = (struct iovec){.iov_base = &out, .iov_len = sizeof(out)};
	return writev(fd, patched, 2);
}

/* Requests as they come; the kernel's INIT is looked at for what it
 * offers in flags2, which libfuse 3.14 does not pass on (passthrough). */
static ssize_t flx_ll_readfd(int fd, void *buf, size_t len, void *userdata)
{
	flx_ll *ll = userdata;
	ssize_t n = read(fd, buf, len);
	struct fuse_in_header h;
	struct fuse_init_in in;

	if (n < (ssize_t)(sizeof(h) + sizeof(in)))
		return n;
	memcpy(&h, buf, sizeof(h));
	if (h.opcode != FUSE_INIT)
		return n;
	memcpy(&in, (const char *)buf + sizeof(h), sizeof(in));
	__atomic_store_n(&ll->kernel_flags2,
			 (in.flags & FUSE_INIT_EXT) ? in.flags2 : 0,
			 __ATOMIC_RELAXED);
	return n;
}

static ssize_t flx_ll_splice(int fdin, off_t *offin, int fdout, off_t *offout,
			     size_t len, unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

/*
 * A reply spliced from libfuse's pipe: header, then the bytes.  One of the
 * wrong length is answered with EIO and drained from the pipe; should the
 * drain fail, -1 makes libfuse drop the thread's pipe with what is left.
 */
static ssize_t flx_ll_splice_send(int fdin, off_t *offin, int fdout,
				  off_t *offout, size_t len, unsigned int flags,
				  void *userdata)
{
	struct fuse_out_header oh;
	char sink[4096];
	size_t left = len;

	if (!reply_expect || len == reply_expect || len < sizeof(oh))
		return flx_ll_splice(fdin, offin, fdout, offout, len, flags,
				     userdata);
	if (read(fdin, &oh, sizeof(oh)) != (ssize_t)sizeof(oh)) {
		errno = EIO;
		return -1;
	}
	send_eio(userdata, fdout, oh.unique);
	for (left -= sizeof(oh); left > 0;) {
		ssize_t n =
		    read(fdin, sink, left < sizeof(sink) ? left : sizeof(sink));

		if (n <= 0) {
			errno = EIO;
			return -1;
		}
		left -= (size_t)n;
	}
	return (ssize_t)len;
}

int flx_ll_session_mounted(struct fuse_session *se)
{
	static const struct fuse_custom_io io = {
	    .writev = flx_ll_writev,
	    .read = flx_ll_readfd,
	    .splice_receive = flx_ll_splice,
	    .splice_send = flx_ll_splice_send,
	};

	/* Meant to replace fuse_session_mount(); after it, it only swaps the
	 * I/O functions over the same /dev/fuse descriptor (libfuse 3.14).
	 * It logs its own failure, so nothing is added here. */
	return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

/* At INIT: keep direct_io only where mmap of direct-io files works. */
static void init_direct_io(flx_ll *ll, struct fuse_conn_info *conn)
{
	if (!ll->direct_io)
		return;
#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	if (conn->capable & FUSE_CAP_DIRECT_IO_ALLOW_MMAP) {
		conn->want |= FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
		return;
	}
#else
	if (conn->proto_major > 7 ||
	    conn->proto_minor >= FLX_LL_DIO_MMAP_MINOR) {
		__atomic_or_fetch(&ll->init_patch, FLX_LL_PATCH_DIO,
				  __ATOMIC_RELEASE);
		return;
	}
#endif
	__atomic_store_n(&ll->direct_io, false, __ATOMIC_RELAXED);
	warn(ll,
	     "direct_io not applied: FUSE protocol %u.%u cannot mmap "
	     "direct-io files (7.%u, Linux 6.6, can); pages are cached",
	     conn->proto_major, conn->proto_minor, FLX_LL_DIO_MMAP_MINOR);
}

/*
 * Passthrough (-o passthrough).  A file that is the whole of one backing
 * file (the core's decision, flx_fs_whole_file()) is opened
 * FOPEN_PASSTHROUGH: the kernel then serves its reads and mmap from the
 * backing file itself, with no request to the daemon and none of the FUSE
 * page cache's cost.  The open still runs the identity check
 * (flx_fs_open_check()); what is given up is the check before each reply:
 * a backing file rewritten in place after the open is served as it then
 * is, not answered EIO; hence an option, off by default.
 *
 * The kernel's rules (fs/fuse/iomode.c, backing.c): registering a backing
 * file (FUSE_DEV_IOC_BACKING_OPEN) needs CAP_SYS_ADMIN and gives an id the
 * kernel looks up after the open reply, so the id must outlive the reply;
 * every open of an inode must name the same backing object while any is
 * open (another id of the same file is refused, EIO to the opener), and
 * passthrough and cached opens of one inode exclude each other; a
 * passthrough open takes no FOPEN_KEEP_CACHE.  So each inode is
 * registered once, at its first open, its id kept while the daemon has
 * opens of it not yet released (the kernel lets go of the inode's backing
 * file before it sends the last RELEASE), and closed with the last; an
 * inode whose registration failed is served by the daemon for the mount's
 * life (logged once), so its opens never mix.  Opens are rare: one lock.
 */
typedef struct flx_pass_ino {
	int32_t bid;	/* the registered backing id, 0: none */
	uint32_t nopen; /* opens answered with bid, not yet released */
	bool daemon;	/* registration failed: served by the daemon */
} flx_pass_ino;

typedef struct flx_pass {
	pthread_mutex_t mu;
	uint64_t n; /* inodes + 1 */
	flx_pass_ino *ino;
	int devfd; /* /dev/fuse */
	int logged;
} flx_pass;

static bool has_sys_admin(void)
{
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];

	if (syscall(SYS_capget, &h, d))
		return false;
	return d[CAP_SYS_ADMIN / 32].effective & (1u << (CAP_SYS_ADMIN % 32));
}

/* At INIT: ask for passthrough where the kernel offers it and this
 * process may register backing files; else one line saying why, and
 * every file is served by the daemon. */
static void init_passthrough(flx_ll *ll, const struct fuse_conn_info *conn)
{
	uint32_t f2 = __atomic_load_n(&ll->kernel_flags2, __ATOMIC_RELAXED);
	const char *why = NULL;
	flx_pass *p = NULL;

	if (!ll->passthrough)
		return;
	if (!ll->se)
		why = "no session";
	else if ((conn->proto_major == 7 &&
		  conn->proto_minor < FLX_LL_PASS_MINOR) ||
		 !(f2 & (uint32_t)(FUSE_PASSTHROUGH >> 32)))
		why = "the kernel does not offer FUSE_PASSTHROUGH (Linux 6.9 "
		      "with CONFIG_FUSE_PASSTHROUGH does)";
	else if (!has_sys_admin())
		why = "registering backing files (FUSE_DEV_IOC_BACKING_OPEN) "
		      "needs CAP_SYS_ADMIN";
	else if (!(p = calloc(1, sizeof(*p))) ||
		 !(p->ino = calloc(flx_fs_inode_count(ll->fs) + 1,
				   sizeof(*p->ino))) ||
		 pthread_mutex_init(&p->mu, NULL))
		why = "out of memory";
	if (why) {
		if (p)
			free(p->ino);
		free(p);
		__atomic_store_n(&ll->passthrough, false, __ATOMIC_RELAXED);
		warn(ll,
		     "passthrough not applied: %s (FUSE protocol %u.%u); "
		     "files are served by the daemon",
		     why, conn->proto_major, conn->proto_minor);
		return;
	}
	p->n = flx_fs_inode_count(ll->fs) + 1;
	p->devfd = fuse_session_fd(ll->se);
	ll->pass = p;
	__atomic_or_fetch(&ll->init_patch, FLX_LL_PATCH_PASS, __ATOMIC_RELEASE);
}

/* Register backing file `file` of ino.  @return 0 and *bid, or -errno. */
static int pass_register(flx_ll *ll, uint32_t file, int32_t *bid)
{
	struct fuse_backing_map map = {0};
	int fd, id, rc = flx_fs_backing_acquire(ll->fs, file, &fd);

	if (rc)
		return rc;
	map.fd = fd;
	id = ioctl(ll->pass->devfd, FUSE_DEV_IOC_BACKING_OPEN, &map);
	rc = id > 0 ? 0 : (id < 0 ? -errno : -EIO);
	/* the kernel holds the file itself: the descriptor may go */
	flx_fs_backing_release(ll->fs, file);
	if (!rc)
		*bid = id;
	return rc;
}

/*
 * The backing id to answer an open of ino with, counted as one open of
 * it until pass_put(); 0: the daemon serves this open (no passthrough
 * for the mount, a file that is not one backing file, or a registration
 * that failed).
 */
static int32_t pass_get(flx_ll *ll, fuse_ino_t ino)
{
	flx_pass *p = ll->pass;
	flx_pass_ino *pi;
	bool whole = false;
	uint32_t file = 0;
	int32_t bid;
	int rc = 0;

	if (!p || ino >= p->n ||
	    !__atomic_load_n(&ll->passthrough, __ATOMIC_RELAXED) ||
	    flx_fs_whole_file(ll->fs, ino, &whole, &file) || !whole)
		return 0;
	pthread_mutex_lock(&p->mu);
	pi = &p->ino[ino];
	if (!pi->bid && !pi->daemon) {
		rc = pass_register(ll, file, &pi->bid);
		pi->daemon = rc != 0;
	}
	if (pi->bid)
		pi->nopen++;
	bid = pi->bid;
	pthread_mutex_unlock(&p->mu);
	/* refused for want of a permission the capability check could not
	 * see (CAP_SYS_ADMIN in a user namespace): the same for every file */
	if (rc == -EPERM &&
	    __atomic_exchange_n(&ll->passthrough, false, __ATOMIC_RELAXED)) {
		warn(ll,
		     "passthrough not applied: the kernel refused to register "
		     "a backing file (%s); files are served by the daemon",
		     strerror(-rc));
		return bid;
	}
	if (rc && !__atomic_exchange_n(&p->logged, 1, __ATOMIC_RELAXED)) {
		char path[1024];

		if (flx_fs_path(ll->fs, ino, path, sizeof(path)))
			snprintf(path, sizeof(path), "inode %lu",
				 (unsigned long)ino);
		warn(ll,
		     "passthrough not applied to %s: its backing file cannot "
		     "be registered (%s); served by the daemon (said once)",
		     path, strerror(-rc));
	}
	return bid;
}

/* An open of ino answered with its backing id is released: the last one
 * closes the id. */
static void pass_put(flx_ll *ll, fuse_ino_t ino)
{
	flx_pass *p = ll->pass;
	flx_pass_ino *pi;

	if (!p || ino >= p->n)
		return;
	pthread_mutex_lock(&p->mu);
	pi = &p->ino[ino];
	if (pi->nopen && !--pi->nopen) {
		uint32_t id = (uint32_t)pi->bid;

		(void)ioctl(p->devfd, FUSE_DEV_IOC_BACKING_CLOSE, &id);
		pi->bid = 0;
	}
	pthread_mutex_unlock(&p->mu);
}

/* At destroy: the ids still registered go (the kernel drops them at
 * unmount anyway), then the table. */
static void pass_stop(flx_ll *ll)
{
	flx_pass *p = ll->pass;

	if (!p)
		return;
	ll->pass = NULL;
	for (uint64_t i = 0; i < p->n; i++) {
		uint32_t id = (uint32_t)p->ino[i].bid;

		if (id)
			(void)ioctl(p->devfd, FUSE_DEV_IOC_BACKING_CLOSE, &id);
	}
	pthread_mutex_destroy(&p->mu);
	free(p->ino);
	free(p);
}

/*
 * Raise the readahead of the mount's bdi, once, from the first request
 * after INIT.  Not earlier: the kernel sets the bdi's ra_pages to
 * min(ra_pages, INIT reply's max_readahead) when it processes the reply,
 * and libfuse can only offer what the kernel proposed (128 KiB).  Not from
 * the main thread after mounting either: that would race the INIT reply.
 * Every request waits for INIT to complete, so any later one is safe; and
 * a file's readahead state is taken from the bdi when it is opened, which
 * needs a lookup first.  Writing the sysfs knob needs root; without it the
 * kernel's default stays (reported only when the user asked for a value).
 */
static void raise_read_ahead(flx_ll *ll)
{
	char path[128];
	FILE *f;
	int e = 0;

	if (!ll->bdi[0] || __atomic_load_n(&ll->ra_done, __ATOMIC_ACQUIRE) ||
	    __atomic_exchange_n(&ll->ra_done, 1, __ATOMIC_ACQ_REL))
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/read_ahead_kb",
		 ll->bdi);
	f = fopen(path, "w");
	if (!f) {
		e = errno;
	} else {
		if (fprintf(f, "%u\n", ll->read_ahead_kb) < 0)
			e = errno;
		if (fclose(f) && !e) /* sysfs reports at the flush */
			e = errno;
	}
	if (e && ll->ra_verbose)
		warn(ll, "read_ahead_kb=%u not applied: %s: %s",
		     ll->read_ahead_kb, path, strerror(e));
}

static const flx_fs *fs_of(fuse_req_t req)
{
	flx_ll *ll = fuse_req_userdata(req);

	raise_read_ahead(ll);
	return ll->fs;
}

static void fill_attr(const flx_stat *st, struct stat *sb)
{
	memset(sb, 0, sizeof(*sb));
	sb->st_ino = st->ino;
	sb->st_mode = (st->dir ? S_IFDIR : S_IFREG) | st->mode;
	sb->st_nlink = st->nlink ? st->nlink : 1;
	sb->st_uid = st->uid;
	sb->st_gid = st->gid;
	sb->st_size = st->dir ? 0 : (off_t)st->size;
	sb->st_blksize = FLX_LL_BSIZE;
	sb->st_blocks = st->dir ? 0 : (blkcnt_t)((st->size + 511) / 512);
	sb->st_mtim.tv_sec = st->mtime_ns / 1000000000;
	sb->st_mtim.tv_nsec = st->mtime_ns % 1000000000;
	sb->st_atim = sb->st_mtim;
	sb->st_ctim = sb->st_mtim;
}

/*
 * Read request size.  libfuse splices a reply through a per-thread pipe,
 * growing it with F_SETPIPE_SZ to what it estimates the reply needs: a
 * page for the header, one per piece of the reply and one more, plus the
 * bytes.  When the pipe cannot grow that far it copies the reply into a
 * buffer it allocates for each reply instead.  Past
 * /proc/sys/fs/pipe-max-size (1 MiB by default) only a process with
 * CAP_SYS_RESOURCE may grow a pipe, which root often lacks in containers,
 * so the kernel's 1 MiB (256-page) requests would never be spliced.
 * Requests are therefore capped so that a reply of up to
 * FLX_LL_SPLICE_PIECES pieces (a .npy header and its data, or the end of
 * one tensor and the start of the next) fits a pipe: the probe below
 * tries a pipe for the largest request; failing that, the request is
 * pipe-max-size less that estimate (996 KiB of a 1 MiB pipe).  The
 * request size matters little within that range (docs/performance.md);
 * unspliced replies cost a second copy.  Replies that need a gather use the
 * reusable per-thread buffer.
 */
#define FLX_LL_REQ_MAX	      (1u << 20)
#define FLX_LL_PAGE	      4096u
#define FLX_LL_SPLICE_PIECES  4u
#define FLX_LL_MAX_BACKGROUND 64u

static size_t splice_max; /* the request size */
static size_t pipe_cap;	  /* bytes a reply pipe can grow to */

/* The pipe libfuse asks for to splice a reply of len bytes in k pieces. */
static size_t pipe_estimate(size_t k, size_t len)
{
	return FLX_LL_PAGE * (k + 2) + sizeof(struct fuse_out_header) + len;
}

static void probe_pipe(void)
{
	FILE *f;
	unsigned long v = 0;
	int p[2];

	if (pipe(p) == 0) {
		int ok = fcntl(p[0], F_SETPIPE_SZ, 2 * FLX_LL_REQ_MAX) > 0;

		close(p[0]);
		close(p[1]);
		if (ok) {
			pipe_cap = 2 * FLX_LL_REQ_MAX;
			splice_max = FLX_LL_REQ_MAX;
			return;
		}
	}
	f = fopen("/proc/sys/fs/pipe-max-size", "r");
	if (!f || fscanf(f, "%lu", &v) != 1)
		v = FLX_LL_REQ_MAX;
	if (f)
		fclose(f);
	pipe_cap = v;
	v = v > pipe_estimate(FLX_LL_SPLICE_PIECES, FLX_LL_PAGE)
		? v - pipe_estimate(FLX_LL_SPLICE_PIECES, 0)
		: FLX_LL_PAGE;
	v = v < FLX_LL_REQ_MAX ? v : FLX_LL_REQ_MAX;
	splice_max = v / FLX_LL_PAGE * FLX_LL_PAGE;
}

static void push_start(flx_ll *ll, const struct fuse_conn_info *conn);
static void maps_start(flx_ll *ll);

static void flx_ll_init(void *userdata, struct fuse_conn_info *conn)
{
	flx_ll *ll = userdata;

	probe_pipe();

	/*
	 * conn->max_read stays 0 (no limit): libfuse 3.14 fails the mount
	 * with EPROTO unless it equals the -o max_read= mount option.  The
	 * request size comes from max_pages, which libfuse derives from
	 * max_write; lowering it is all this takes.  max_readahead is left
	 * as libfuse clamped it (to the kernel's offer); the real readahead
	 * is raised later, see raise_read_ahead().
	 */
	if (conn->max_write > splice_max)
		conn->max_write = (unsigned)splice_max;
	splice_max = conn->max_write;
	/* Readahead of several requests keeps the reader, the kernel and
	 * the daemon's threads busy at once (the count:
	 * docs/performance.md). */
	if (ll->read_ahead_kb == FLX_LL_RA_AUTO)
		ll->read_ahead_kb = 4 * (conn->max_write / 1024);
	/* The data never changes: no need to revalidate pages on getattr. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	/* Replies made of backing ranges and literal bytes are spliced from
	 * the files (flx_ll_read): pages move to /dev/fuse without a copy in
	 * user space.  Spliced, not moved: with SPLICE_F_MOVE the kernel
	 * tries to steal each whole, aligned page of a backing file from the
	 * pipe, which takes it out of the backing file's page cache (a later
	 * read of the same bytes goes to disk) and, when the page carries a
	 * flag its check does not expect (PG_young, set by DAMON or idle page
	 * tracking), dumps it to the kernel log ("fuse: trying to steal weird
	 * page") and copies it after all.  What it saves is one copy of a
	 * page. */
	conn->want &= ~FUSE_CAP_SPLICE_MOVE;
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	/* Readahead requests are background requests, and every reader
	 * keeps a window of 4 in flight; the kernel's default of 12 lets
	 * only three readers do so (figure 7 of docs/performance.md).  The
	 * congestion threshold is libfuse's 3/4 of it. */
	if (conn->max_background < FLX_LL_MAX_BACKGROUND)
		conn->max_background = FLX_LL_MAX_BACKGROUND;
	init_direct_io(ll, conn);
	init_passthrough(ll, conn);
	maps_start(ll);
	push_start(ll, conn);
}

static void flx_ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	flx_stat st;
	int rc = flx_fs_lookup(fs_of(req), parent, name, &st);

	if (rc && rc != -ENOENT) {
		fuse_reply_err(req, -rc);
		return;
	}
	memset(&e, 0, sizeof(e));
	e.entry_timeout = FLX_LL_TIMEOUT;
	e.attr_timeout = FLX_LL_TIMEOUT;
	if (rc == 0) { /* else ino 0: a cached negative entry */
		e.ino = st.ino;
		fill_attr(&st, &e.attr);
	}
	fuse_reply_entry(req, &e);
}

static void flx_ll_getattr(fuse_req_t req, fuse_ino_t ino,
			   struct fuse_file_info *fi)
{
	struct stat sb;
	flx_stat st;
	int rc = flx_fs_stat(fs_of(req), ino, &st);

	(void)fi;
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	fill_attr(&st, &sb);
	fuse_reply_attr(req, &sb, FLX_LL_TIMEOUT);
}

static void flx_ll_opendir(fuse_req_t req, fuse_ino_t ino,
			   struct fuse_file_info *fi)
{
	flx_stat st;
	int rc = flx_fs_stat(fs_of(req), ino, &st);

	if (rc == 0 && !st.dir)
		rc = -ENOTDIR;
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

/*
 * Directory position i: 0 is ".", 1 is "..", i >= 2 is the core's entry
 * i - 2.  Only st_ino and the type bits of *sb matter to readdir.
 * @return 0 with *name (NULL past the end) and *sb, or -errno.
 */
static int dirent_at(const flx_fs *fs, fuse_ino_t dir, uint64_t i,
		     const char **name, struct stat *sb)
{
	flx_stat st = {.ino = dir, .dir = true};
	int rc = 0;

	if (i == 0) {
		*name = ".";
	} else if (i == 1) {
		*name = "..";
		/* The core keeps no parent links; readdir's d_ino for ".."
		 * is informational, as in libfuse's examples. */
		if (flx_fs_lookup(fs, dir, "..", &st) != 0)
			st = (flx_stat){.ino = FLX_ROOT_INO, .dir = true};
	} else {
		rc = flx_fs_readdir(fs, dir, i - 2, name, &st);
	}
	memset(sb, 0, sizeof(*sb));
	sb->st_ino = st.ino;
	sb->st_mode = st.dir ? S_IFDIR : S_IFREG;
	return rc;
}

static void flx_ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	char *buf = malloc(size ? size : 1);
	size_t used = 0;
	int rc = buf ? 0 : -ENOMEM;

	(void)fi;
	/* The offset stored with each entry is that of the next one. */
	for (uint64_t i = (uint64_t)off; rc == 0; i++) {
		const char *name;
		struct stat sb;
		size_t len;

		rc = dirent_at(fs_of(req), ino, i, &name, &sb);
		if (rc || !name)
			break;
		len = fuse_add_direntry(req, buf + used, size - used, name, &sb,
					(off_t)(i + 1));
		if (len > size - used)
			break; /* full: the kernel asks again from i */
		used += len;
	}
	if (rc < 0 && used == 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_buf(req, buf, used);
	free(buf);
}

static void flx_ll_open(fuse_req_t req, fuse_ino_t ino,
			struct fuse_file_info *fi)
{
	flx_ll *ll = fuse_req_userdata(req);
	int32_t bid;
	int rc;

	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	/* refuse to open a view whose backing files were replaced or
	 * rewritten since mount: it would no longer be the checkpoint */
	flx_file_changed_why(NULL, 0); /* this request's finding only */
	rc = flx_fs_open_check(fs_of(req), ino);
	if (rc) {
		log_once(fuse_req_userdata(req), ino, "open", -rc, NULL);
		fuse_reply_err(req, -rc);
		return;
	}
	__atomic_add_fetch(&ll->n_opens, 1, __ATOMIC_RELAXED);
	bid = pass_get(ll, ino);
	if (bid) {
		/* the kernel's rules: no keep_cache (there is no page cache
		 * of the view to keep), and reads go to the backing file */
		fi->keep_cache = 0;
		fi->direct_io = 0;
		fi->fh = FLX_LL_FH_PASS;
		reply_bid = bid;
		rc = fuse_reply_open(req, fi);
		reply_bid = 0;
		if (rc) /* never opened: no RELEASE will come */
			pass_put(ll, ino);
		else
			__atomic_add_fetch(&ll->n_pass_opens, 1,
					   __ATOMIC_RELAXED);
		return;
	}
	fi->keep_cache = 1; /* contents are fixed: reuse pages across opens */
	fi->direct_io = __atomic_load_n(&ll->direct_io, __ATOMIC_RELAXED);
	fuse_reply_open(req, fi);
}

static void flx_ll_release(fuse_req_t req, fuse_ino_t ino,
			   struct fuse_file_info *fi)
{
	if (fi->fh == FLX_LL_FH_PASS)
		pass_put(fuse_req_userdata(req), ino);
	fuse_reply_err(req, 0);
}

/*
 * Per worker thread, one reply buffer that only grows: a fresh allocation
 * per request of up to 1 MiB costs a page fault per page, which
 * dominates a read.  Mapped with MAP_POPULATE, so that even a thread's
 * first reply takes no page fault per page (in a virtual machine each
 * traps to the hypervisor: docs/performance-history.md, "Scale: small
 * items, second round"); a reply's old bytes are never needed, so growing
 * maps a new buffer.  Unmapped when the thread exits.
 */
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;

struct reply_buf {
	size_t map; /* bytes mapped, this header included */
	char data[];
};

static void buf_free(void *p)
{
	struct reply_buf *b = p;

	if (b)
		munmap(b, b->map);
}

static void buf_key_init(void)
{
	(void)pthread_key_create(&buf_key, buf_free);
}

static char *reply_buf(size_t size)
{
	struct reply_buf *b;

	pthread_once(&buf_once, buf_key_init);
	b = pthread_getspecific(buf_key);
	if (!b || b->map - sizeof(*b) < size) {
		size_t map = (sizeof(*b) + size + FLX_LL_PAGE - 1) /
			     FLX_LL_PAGE * FLX_LL_PAGE;
		void *m =
		    mmap(NULL, map, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

		if (m == MAP_FAILED)
			return NULL;
		if (pthread_setspecific(buf_key, m)) {
			munmap(m, map);
			return NULL;
		}
		buf_free(b);
		b = m;
		b->map = map;
	}
	return b->data;
}

/*
 * Replies from mapped backing files.  A reply of more ranges than a pipe
 * holds (a file of many small tensors: hundreds of ranges a request) is
 * written to /dev/fuse as an iovec over the backing files, mapped
 * read-only, so that the kernel copies each byte once, from the page
 * cache into the reader's pages, where a copy reply copies it twice (into
 * the thread's buffer, then into /dev/fuse).  A file is mapped whole, at
 * its size then, by the first reply that needs it, and stays mapped until
 * the session ends; at most FLX_LL_MAPS_MAX files are (past that, and
 * where mmap fails, replies are copies).  Nothing in the daemon reads a
 * mapping: only the kernel does, while it copies the reply.  A file cut
 * short after the check and before that copy: the kernel cannot take the
 * missing pages (no SIGBUS: the write fails with EFAULT), ends the request
 * with EIO (fuse_dev_do_write()), and flx_ll_writev() logs it; the reader
 * gets EIO, never a shorter file nor zeros.  A range past the mapping
 * (the file was already shorter when it was mapped) is not sent from it.
 */
#define FLX_LL_MAPS_MAX	  4096u
#define FLX_LL_MAP_PIECES 1023u /* IOV_MAX less the reply's header */

/* One file's mapping, immutable once published in flx_maps.at. */
struct file_map {
	const unsigned char *addr;
	size_t len;
};

/* Published for a file that cannot be mapped (mmap failed): not tried
 * again. */
static struct file_map unmappable;

/* The checkpoint's mapped files: at[i] is NULL until file i is mapped,
 * then its mapping (published with a compare-and-swap, read atomically);
 * count (atomic) the files mapped. */
typedef struct flx_maps {
	size_t n;
	struct file_map **at;
	unsigned count;
} flx_maps;

static void maps_start(flx_ll *ll)
{
	flx_maps *m = calloc(1, sizeof(*m));

	if (!m || !ll->nfiles ||
	    !(m->at = calloc(ll->nfiles, sizeof(*m->at)))) {
		free(m);
		return; /* no mapping: replies of many ranges are copies */
	}
	m->n = ll->nfiles;
	ll->maps = m;
}

static void maps_stop(flx_ll *ll)
{
	flx_maps *m = ll->maps;

	if (!m)
		return;
	ll->maps = NULL;
	for (size_t i = 0; i < m->n; i++)
		if (m->at[i] && m->at[i] != &unmappable) {
			munmap((void *)m->at[i]->addr, m->at[i]->len);
			free(m->at[i]);
		}
	free(m->at);
	free(m);
}

/* Backing file `file` (its descriptor fd) mapped whole.  @return its
 * mapping, or NULL (too many files mapped, empty, or mmap failed). */
static const struct file_map *map_of(flx_maps *m, uint32_t file, int fd)
{
	struct file_map *f, *none = NULL;
	struct stat st;
	void *a;

	if (file >= m->n)
		return NULL;
	f = __atomic_load_n(&m->at[file], __ATOMIC_ACQUIRE);
	if (f)
		return f != &unmappable ? f : NULL;
	if (__atomic_add_fetch(&m->count, 1, __ATOMIC_RELAXED) >
	    FLX_LL_MAPS_MAX) {
		__atomic_sub_fetch(&m->count, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	if (fstat(fd, &st) || st.st_size <= 0 ||
	    (uint64_t)st.st_size > SIZE_MAX || !(f = malloc(sizeof(*f)))) {
		__atomic_sub_fetch(&m->count, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	a = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (a == MAP_FAILED) {
		free(f);
		__atomic_sub_fetch(&m->count, 1, __ATOMIC_RELAXED);
		(void)__atomic_compare_exchange_n(
		    &m->at[file], &none, &unmappable, false, __ATOMIC_ACQ_REL,
		    __ATOMIC_ACQUIRE);
		return NULL;
	}
	*f = (struct file_map){a, (size_t)st.st_size};
	if (!__atomic_compare_exchange_n(&m->at[file], &none, f, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		munmap(a, f->len); /* another thread mapped it first */
		free(f);
		__atomic_sub_fetch(&m->count, 1, __ATOMIC_RELAXED);
		return none != &unmappable ? none : NULL;
	}
	return f;
}

/* The iovec of pieces p[0..k) (k <= FLX_LL_MAP_PIECES): backing ranges
 * in their files' mappings, the rest where it is.  @return true, or
 * false when some range cannot be sent from a mapping. */
static bool iov_of(flx_maps *m, struct iovec *iov, const flx_piece *p, size_t k)
{
	const struct file_map *f = NULL;

	for (size_t i = 0; i < k; i++) {
		if (p[i].fd < 0) {
			iov[i] = (struct iovec){(void *)p[i].mem, p[i].len};
			continue;
		}
		if (!f || p[i - 1].fd < 0 || p[i - 1].file != p[i].file)
			f = map_of(m, p[i].file, p[i].fd);
		if (!f || p[i].src > f->len || p[i].len > f->len - p[i].src)
			return false;
		iov[i] = (struct iovec){(void *)(f->addr + p[i].src), p[i].len};
	}
	return true;
}

/*
 * Whether a reply of these pieces (len bytes) can be spliced.  libfuse's
 * estimate of the pipe (pipe_estimate()) must fit pipe_cap, or libfuse
 * stops growing the thread's pipe for good.  The pipe's slots must hold
 * the reply: one for the header, one per page or part of a page each
 * spliced range touches, one per started page of literal bytes.  The pipe
 * has at least the estimate rounded up to a power of two pages (the
 * kernel's rounding; pipes never shrink), which can be fewer slots than
 * ranges that start mid-page need.  A splice that ran out of slots would
 * still be right (libfuse copies the rest) but slow.
 */
static bool splice_fits(const flx_piece *p, size_t k, size_t len)
{
	size_t est = pipe_estimate(k, len), slots = 1, pages = 1;
	bool fd = false;

	if (est > pipe_cap)
		return false;
	while (pages * FLX_LL_PAGE < est)
		pages *= 2;
	for (size_t i = 0; i < k; i++) {
		size_t lead = p[i].fd >= 0 ? p[i].src % FLX_LL_PAGE : 0;

		slots += (lead + p[i].len + FLX_LL_PAGE - 1) / FLX_LL_PAGE;
		fd |= p[i].fd >= 0;
	}
	/* literal bytes alone are sent from memory: one copy, not two */
	return fd && slots <= pages;
}

/* How a reply of pieces is sent: the decision apart from the sending. */
typedef enum { SEND_COPY, SEND_SPLICE, SEND_MEMORY } send_way;

/*
 * Ranges of files, with literal bytes, are spliced if the pipe holds them;
 * bytes in memory alone (literal, or zstd content in pinned windows) are
 * written from where they are; pinned windows beside a file's range are
 * not spliced (the pipe would hold references to cache pages) but copied,
 * as is anything else.
 */
static send_way send_way_of(const flx_piece *p, size_t k, size_t len)
{
	bool fd = false, pin = false;

	for (size_t i = 0; i < k; i++) {
		fd |= p[i].fd >= 0;
		pin |= p[i].pin != NULL;
	}
	if (k == 0 || (fd && pin))
		return SEND_COPY;
	if (!fd)
		return SEND_MEMORY;
	return splice_fits(p, k, len) ? SEND_SPLICE : SEND_COPY;
}

/* a fuse_bufvec ends in buf[1]: room for the others after it */
typedef union {
	struct fuse_bufvec bv;
	unsigned char mem[sizeof(struct fuse_bufvec) +
			  (FLX_LL_SPLICE_PIECES - 1) * sizeof(struct fuse_buf)];
} piece_vec;

/* The bufvec of pieces p[0..k) (k <= FLX_LL_SPLICE_PIECES): backing
 * ranges as file descriptors at their offsets, the rest as memory. */
static struct fuse_bufvec *bufvec_of(piece_vec *v, const flx_piece *p, size_t k)
{
	struct fuse_bufvec *bv = &v->bv;

	*bv = (struct fuse_bufvec)FUSE_BUFVEC_INIT(0);
	bv->count = k;
	for (size_t i = 0; i < k; i++) {
		struct fuse_buf *b = &bv->buf[i];

		*b = (struct fuse_buf){.size = p[i].len};
		if (p[i].fd >= 0) {
			b->flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
			b->fd = p[i].fd;
			b->pos = (off_t)p[i].src;
		} else {
			b->mem = (void *)p[i].mem;
		}
	}
	return bv;
}

/*
 * Pushing a tensor ahead of its reader (-o push_ahead_kb).  A loader that
 * maps a view faults its tensors in page by page; each fault that misses
 * the page cache waits for a read request the kernel's readahead sizes.
 * When a read lands in a tensor, the rest of that tensor past the mount's
 * readahead window (up to push_kb, flx_fs_push_range() decides) is stored
 * into the kernel's page cache with FUSE_NOTIFY_STORE by one pusher
 * thread, so that the reader's later faults can find their pages there;
 * the window itself is left to readahead, which would otherwise ask for
 * the same pages again.  docs/performance.md ("first-fault levers") has
 * the measurements: the store costs the page-cache fill a read request
 * costs, so it is off by default.  The bytes are those a read would
 * reply, from the same pieces (checked unchanged backing ranges, or a
 * gather); a push of a size other than announced is refused by the kernel
 * (it checks the notification's length), so a backing file that shrinks
 * under a push stores nothing.  Pushed pages stay valid: files are opened
 * keep_cache and the mount does not ask for auto_inval_data.  The pusher
 * is never a worker of the session: a store waits for page locks that
 * in-flight read requests hold, which the workers answer.
 *
 * Requests are queued (at most FLX_LL_PUSH_QUEUE; a full queue drops the
 * newest: pushing is only ever an optimization).  Per inode the last range
 * queued is remembered, so the reads that follow a push (readahead of the
 * same tensor) do not queue its bytes again.
 */
#define FLX_LL_PUSH_QUEUE 64

struct push_job {
	fuse_ino_t ino;
	uint64_t off, len;
};

typedef struct flx_pusher {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct push_job q[FLX_LL_PUSH_QUEUE];
	size_t head, n;
	bool stop;
	pthread_t thread;
	uint64_t nino;
	uint64_t skip;	       /* bytes past a read its readahead covers */
	struct push_job *last; /* per inode: the range last queued */
} flx_pusher;

/* Bytes [off, off+n) of ino copied into buf for a reply that cannot send
 * pieces pc[0..np) of flx_fs_pieces(ino, off, n, buf) as they are: from
 * the pieces when there are some, without walking the file again, else
 * read (np 0: a gather, or more pieces than a reply takes).  Releases the
 * pieces.  @return as flx_fs_read(). */
static ssize_t reply_copy(const flx_fs *fs, fuse_ino_t ino, const flx_piece *pc,
			  size_t np, char *buf, size_t n, uint64_t off)
{
	ssize_t got;

	if (!np)
		return flx_fs_read(fs, ino, buf, n, off, NULL);
	got = flx_fs_pieces_copy(fs, pc, np, buf);
	if (got < 0)
		flx_fs_pieces_release(fs, pc, np);
	else
		flx_fs_pieces_sent(fs, pc, np);
	return got;
}

/* Store bytes [off, off+len) of ino (len <= the request size) in the
 * kernel's page cache.  @return 0 or -errno. */
static int push_chunk(flx_ll *ll, fuse_ino_t ino, uint64_t off, size_t len)
{
	flx_piece pc[FLX_LL_SPLICE_PIECES];
	piece_vec v;
	struct fuse_bufvec *bv;
	char *buf = reply_buf(len);
	size_t np = 0;
	ssize_t n;
	int rc;

	if (!buf)
		return -ENOMEM;
	rc = flx_fs_pieces(ll->fs, ino, off, len, buf, pc, FLX_LL_SPLICE_PIECES,
			   &np);
	if (rc)
		return rc;
	/* a notification takes one more page of libfuse's pipe estimate
	 * than a reply (its own header) */
	if (np && send_way_of(pc, np, len + FLX_LL_PAGE) != SEND_COPY) {
		rc = fuse_lowlevel_notify_store(ll->se, ino, (off_t)off,
						bufvec_of(&v, pc, np), 0);
		flx_fs_pieces_release(ll->fs, pc, np);
		return rc;
	}
	n = reply_copy(ll->fs, ino, pc, np, buf, len, off);
	if (n < 0)
		return (int)n;
	if ((size_t)n != len)
		return -EIO;
	bv = &v.bv;
	*bv = (struct fuse_bufvec)FUSE_BUFVEC_INIT(len);
	bv->buf[0].mem = buf;
	return fuse_lowlevel_notify_store(ll->se, ino, (off_t)off, bv, 0);
}

static void *push_main(void *arg)
{
	flx_ll *ll = arg;
	flx_pusher *p = ll->push;
	size_t chunk = splice_max > 2 * FLX_LL_PAGE ? splice_max - FLX_LL_PAGE
						    : FLX_LL_PAGE;

	for (;;) {
		struct push_job j;

		pthread_mutex_lock(&p->mu);
		while (!p->n && !p->stop)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stop) {
			pthread_mutex_unlock(&p->mu);
			return NULL;
		}
		j = p->q[p->head];
		p->head = (p->head + 1) % FLX_LL_PUSH_QUEUE;
		p->n--;
		pthread_mutex_unlock(&p->mu);
		/* a failure (the kernel forgot the inode, a backing file
		 * changed) ends this push; the reader's requests still come */
		for (uint64_t at = 0; at < j.len; at += chunk)
			if (push_chunk(ll, j.ino, j.off + at,
				       (size_t)(j.len - at < chunk ? j.len - at
								   : chunk)))
				break;
	}
}

/* At INIT: start the pusher when asked for and the kernel can store
 * (protocol 7.15); without it the mount just reads on demand. */
static void push_start(flx_ll *ll, const struct fuse_conn_info *conn)
{
	flx_pusher *p;

	if (!ll->push_kb || !ll->se)
		return;
	if (conn->proto_major == 7 && conn->proto_minor < 15) {
		warn(ll,
		     "push_ahead_kb not applied: FUSE protocol %u.%u "
		     "cannot store pages (7.15 can)",
		     conn->proto_major, conn->proto_minor);
		return;
	}
	p = calloc(1, sizeof(*p));
	if (p) {
		p->nino = flx_fs_inode_count(ll->fs) + 1;
		p->last = calloc(p->nino, sizeof(*p->last));
	}
	if (!p || !p->last || pthread_mutex_init(&p->mu, NULL)) {
		if (p)
			free(p->last);
		free(p);
		warn(ll, "push_ahead_kb not applied: out of memory");
		return;
	}
	pthread_cond_init(&p->cv, NULL);
	/* the mount's readahead (the kernel's 128 KiB when left to it): the
	 * bytes after a read that its own readahead requests anyway */
	p->skip = (uint64_t)(ll->read_ahead_kb ? ll->read_ahead_kb : 128) << 10;
	ll->push = p;
	if (pthread_create(&p->thread, NULL, push_main, ll)) {
		ll->push = NULL;
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		free(p->last);
		free(p);
		warn(ll, "push_ahead_kb not applied: no thread");
	}
}

static void push_stop(flx_ll *ll)
{
	flx_pusher *p = ll->push;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	ll->push = NULL;
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->last);
	free(p);
}

static void flx_ll_destroy(void *userdata)
{
	push_stop(userdata);
	pass_stop(userdata);
	maps_stop(userdata);
}

/* After a read of [off, off+n) of ino: queue what the core says to push,
 * less what the last push of that inode already covers. */
static void push_after(flx_ll *ll, fuse_ino_t ino, uint64_t off, size_t n)
{
	flx_pusher *p = ll->push;
	struct push_job *last;
	uint64_t po, pl, end;

	if (!p || ino >= p->nino ||
	    flx_fs_push_range(ll->fs, ino, off, n, p->skip,
			      (uint64_t)ll->push_kb << 10, &po, &pl) ||
	    !pl)
		return;
	end = po + pl;
	pthread_mutex_lock(&p->mu);
	last = &p->last[ino];
	if (last->len && po >= last->off && po < last->off + last->len) {
		uint64_t lend = last->off + last->len;

		if (end <= lend) {
			pthread_mutex_unlock(&p->mu);
			return;
		}
		po = lend;
		last->len = end - last->off;
	} else {
		*last = (struct push_job){ino, po, pl};
	}
	if (p->n < FLX_LL_PUSH_QUEUE) {
		p->q[(p->head + p->n) % FLX_LL_PUSH_QUEUE] =
		    (struct push_job){ino, po, end - po};
		p->n++;
		pthread_cond_signal(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
}

/* Per worker thread: the pieces of a read, and the iovec of a reply
 * from mapped files (send_mapped()). */
static _Thread_local flx_piece read_pc[FLX_LL_MAP_PIECES];
static _Thread_local struct iovec read_iov[FLX_LL_MAP_PIECES];

/* Reply to a read of ino with pieces pc[0..np) (len bytes) from the
 * mapped backing files, and release them.  @return true when sent, false
 * (pieces kept) when some range cannot be sent from a mapping. */
static bool send_mapped(flx_ll *ll, fuse_req_t req, fuse_ino_t ino,
			const flx_piece *pc, size_t np, size_t len)
{
	if (!ll->maps || np > FLX_LL_MAP_PIECES ||
	    !iov_of(ll->maps, read_iov, pc, np))
		return false;
	__atomic_add_fetch(&ll->n_mapped, 1, __ATOMIC_RELAXED);
	reply_expect = sizeof(struct fuse_out_header) + len;
	reply_ino = ino;
	fuse_reply_iov(req, read_iov, (int)np);
	reply_expect = 0;
	flx_fs_pieces_sent(ll->fs, pc, np);
	return true;
}

/*
 * A range made of whole backing ranges and literal bytes (headers) is
 * replied from the files, spliced, so its bytes are copied once (by the
 * kernel, into the page cache or the reader); when the pipe cannot hold
 * them (more pieces than FLX_LL_SPLICE_PIECES: small tensors), from the
 * files' mappings, again copied once (send_mapped()); literal bytes alone
 * are sent from the buffer they were generated into; anything else (a
 * strided gather, more ranges than an iovec takes) is read into the
 * thread's buffer and sent from there.
 */
static void flx_ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			struct fuse_file_info *fi)
{
	const flx_fs *fs = fs_of(req);
	flx_ll *ll = fuse_req_userdata(req);
	flx_piece *pc = read_pc;
	flx_stat st;
	char *buf;
	size_t len = 0, np = 0;
	send_way way;
	ssize_t n;
	int rc;

	(void)fi;
	__atomic_add_fetch(&ll->n_reads, 1, __ATOMIC_RELAXED);
	flx_file_changed_why(NULL, 0); /* this request's finding only */
	buf = reply_buf(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	rc = flx_fs_stat(fs, ino, &st);
	if (!rc && !st.dir && (uint64_t)off < st.size) {
		len = st.size - (uint64_t)off < size
			  ? (size_t)(st.size - (uint64_t)off)
			  : size;
		rc = flx_fs_pieces(
		    fs, ino, (uint64_t)off, len, buf, pc,
		    ll->maps ? FLX_LL_MAP_PIECES : FLX_LL_SPLICE_PIECES, &np);
	}
	way = rc || np > FLX_LL_SPLICE_PIECES ? SEND_COPY
					      : send_way_of(pc, np, len);
	if (way == SEND_COPY && !rc && np &&
	    send_mapped(ll, req, ino, pc, np, len)) {
		push_after(ll, ino, (uint64_t)off, len);
		return;
	}
	if (way == SEND_COPY && np > FLX_LL_SPLICE_PIECES) {
		/* too many to copy one by one: read the range as a batch */
		flx_fs_pieces_release(fs, pc, np);
		np = 0;
	}
	if (way == SEND_SPLICE) {
		piece_vec v;

		reply_expect = sizeof(struct fuse_out_header) + len;
		reply_ino = ino;
		fuse_reply_data(req, bufvec_of(&v, pc, np), 0);
		reply_expect = 0;
		flx_fs_pieces_release(fs, pc, np);
		push_after(ll, ino, (uint64_t)off, len);
		return;
	}
	if (way == SEND_MEMORY) {
		struct iovec *iov = read_iov;

		for (size_t i = 0; i < np; i++)
			iov[i] = (struct iovec){(void *)pc[i].mem, pc[i].len};
		reply_expect = sizeof(struct fuse_out_header) + len;
		reply_ino = ino;
		fuse_reply_iov(req, iov, (int)np);
		reply_expect = 0;
		flx_fs_pieces_sent(fs, pc, np); /* the windows' pins */
		push_after(ll, ino, (uint64_t)off, len);
		return;
	}
	if (rc < 0) {
		flx_fs_pieces_release(fs, pc, np);
		log_once(fuse_req_userdata(req), ino, "read", -rc, NULL);
		fuse_reply_err(req, -rc);
		return;
	}
	n = reply_copy(fs, ino, pc, np, buf, np ? len : size, (uint64_t)off);
	if (n < 0) {
		log_once(fuse_req_userdata(req), ino, "read", (int)-n, NULL);
		fuse_reply_err(req, (int)-n);
	} else {
		fuse_reply_buf(req, buf, (size_t)n);
		push_after(ll, ino, (uint64_t)off, (size_t)n);
	}
}

static void flx_ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
	const flx_fs *fs = fs_of(req);
	struct statvfs sv;

	(void)ino;
	memset(&sv, 0, sizeof(sv));
	sv.f_bsize = FLX_LL_BSIZE;
	sv.f_frsize = FLX_LL_BSIZE;
	sv.f_blocks =
	    (flx_fs_total_bytes(fs) + FLX_LL_BSIZE - 1) / FLX_LL_BSIZE;
	sv.f_files = flx_fs_inode_count(fs);
	sv.f_namemax = 255;
	/* FUSE carries no flags; the kernel reports ST_RDONLY from the ro
	 * mount flag.  Set for completeness. */
	sv.f_flag = ST_RDONLY;
	fuse_reply_statfs(req, &sv);
}

static void flx_ll_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	(void)ino;
	fuse_reply_err(req, (mask & W_OK) ? EROFS : 0);
}

/*
 * Every modifying operation: EROFS.  With the ro mount flag the VFS
 * already refuses most of them; these cover what still gets through.
 */
static void erofs(fuse_req_t req)
{
	fuse_reply_err(req, EROFS);
}

static void flx_ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			   int to_set, struct fuse_file_info *fi)
{
	(void)ino, (void)attr, (void)to_set, (void)fi;
	erofs(req);
}

static void flx_ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
			 mode_t mode, dev_t rdev)
{
	(void)parent, (void)name, (void)mode, (void)rdev;
	erofs(req);
}

static void flx_ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			 mode_t mode)
{
	(void)parent, (void)name, (void)mode;
	erofs(req);
}

static void flx_ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)parent, (void)name;
	erofs(req);
}

static void flx_ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
			   const char *name)
{
	(void)link, (void)parent, (void)name;
	erofs(req);
}

static void flx_ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			  fuse_ino_t newparent, const char *newname,
			  unsigned int flags)
{
	(void)parent, (void)name, (void)newparent, (void)newname, (void)flags;
	erofs(req);
}

static void flx_ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
			const char *newname)
{
	(void)ino, (void)newparent, (void)newname;
	erofs(req);
}

static void flx_ll_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			  mode_t mode, struct fuse_file_info *fi)
{
	(void)parent, (void)name, (void)mode, (void)fi;
	erofs(req);
}

static void flx_ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
			 size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)ino, (void)buf, (void)size, (void)off, (void)fi;
	erofs(req);
}

static void flx_ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			    const char *value, size_t size, int flags)
{
	(void)ino, (void)name, (void)value, (void)size, (void)flags;
	erofs(req);
}

static void flx_ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)ino, (void)name;
	erofs(req);
}

static const struct fuse_lowlevel_ops flx_ll_ops = {
    .init = flx_ll_init,
    .destroy = flx_ll_destroy,
    .lookup = flx_ll_lookup,
    .getattr = flx_ll_getattr,
    .opendir = flx_ll_opendir,
    .readdir = flx_ll_readdir,
    .open = flx_ll_open,
    .release = flx_ll_release,
    .read = flx_ll_read,
    .statfs = flx_ll_statfs,
    .access = flx_ll_access,
    .setattr = flx_ll_setattr,
    .mknod = flx_ll_mknod,
    .mkdir = flx_ll_mkdir,
    .unlink = flx_ll_unlink,
    .rmdir = flx_ll_unlink, /* same signature, same answer */
    .symlink = flx_ll_symlink,
    .rename = flx_ll_rename,
    .link = flx_ll_link,
    .create = flx_ll_create,
    .write = flx_ll_write,
    .setxattr = flx_ll_setxattr,
    .removexattr = flx_ll_removexattr,
};

struct fuse_session *flx_ll_session_new(struct fuse_args *args, flx_ll *ll)
{
	ll->se = fuse_session_new(args, &flx_ll_ops, sizeof(flx_ll_ops), ll);
	return ll->se;
}
