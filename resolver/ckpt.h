/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_CKPT_H
#define FLX_RESOLVER_CKPT_H

/*
 * The global index of a source checkpoint: every tensor (FQN, dtype, global
 * shape, saved chunks and where each chunk's raw storage sits on disk), the
 * non-tensor values (objects), and the other files of the directory.  The
 * format it was read from (a source, resolver/sources.c) shows only in
 * flx_ckpt.format and .writer, and in the source's facts
 * (flx_ckpt_fact()).
 *
 * flx_ckpt_open() validates everything that can be validated without
 * reading tensor payloads; after it succeeds every chunk's bytes are known
 * to lie inside files that were open, regular and long enough at mount.
 * The checkpoint directory is only ever opened O_RDONLY.
 *
 * Thread-safety: immutable after open (after flx_ckpt_finish() for
 * flx_ckpt_open_start()); any number of threads may read.
 */

#include "dtype.h"
#include "error.h"
#include "grow.h"
#include "opt.h"
#include "shape.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Who may read something: an owner, a group and read bits (a subset of
 * 0444, one per class as in st_mode).  The mount serves every node with the
 * access of what its bytes come from (default_permissions makes the kernel
 * enforce it), so that a view is never readable by someone who could not
 * read its source files.
 */
typedef struct flx_access {
	uid_t uid;
	gid_t gid;
	uint16_t read; /* S_IRUSR | S_IRGRP | S_IROTH, or fewer */
} flx_access;

typedef struct flx_file {
	char *relpath; /* relative to the checkpoint directory */
	/* O_RDONLY, opened at mount; -1 for a file past the descriptor
	 * budget, opened on use by the fd table: read through
	 * flx_file_acquire() */
	int fd;
	uint64_t size; /* st_size at mount */
	dev_t dev;     /* identity at mount, to detect replacement */
	ino_t ino;
	int64_t mtime_ns;
	int64_t ctime_ns;  /* moves with any write, even one whose mtime is
			    * put back (touch -d): what catches it */
	flx_access access; /* owner, group and read bits at mount */
	bool data;	   /* a file of the checkpoint itself (false: an extra,
			    * passed through unchanged) */
	/* a memory file of bytes the source decoded at mount (relpath
	 * names it, for messages: no path leads to it), verified by its
	 * descriptor only; it keeps its descriptor (no path reopens it) */
	bool decoded;
	/* when the path was last found to still name this file (CLOCK_MONOTONIC
	 * ns; 0 never); the one mutable field, updated atomically */
	int64_t path_checked_ns;
	/* not in the directory: read through flx_ckpt.backend (a file another
	 * node holds), as the backend's file remote_id; fd is -1 and no
	 * descriptor is ever acquired for it (flx_file_acquire(): -EREMOTE) */
	bool remote;
	uint32_t remote_id;
} flx_file;

/* One read of a batch: len bytes at off of a file into buf. */
typedef struct flx_file_span {
	uint32_t file; /* flx_ckpt.files index; the backend's id in read() */
	uint64_t off;
	void *buf;
	size_t len;
} flx_file_span;

/*
 * Where the files a checkpoint names come from when the directory lacks
 * them: the distributed mount's other nodes (resolver/remote/mpi_mount.h).
 * Files found in the directory are always read from it.  Every function is
 * thread-safe; the backend outlives every index opened with it.
 */
typedef struct flx_file_backend {
	void *ctx;
	/* relpath's id, size and mtime when the backend serves it: 0, or
	 * -ENOENT (nobody holds it) */
	int (*lookup)(void *ctx, const char *relpath, uint32_t *id,
		      uint64_t *size, int64_t *mtime_ns);
	/* the relpath of file id, 0..; NULL past the last (extras); in
	 * strcmp() order of relpaths */
	const char *(*name)(void *ctx, uint32_t id);
	/* every span whole (span.file is an id of lookup()), all spans of a
	 * call at once, so that the backend can coalesce and overlap them:
	 * 0, or -EIO (a holder gone, timed out or refusing) / -ENOMEM */
	int (*read)(void *ctx, const flx_file_span *spans, size_t n);
} flx_file_backend;

/* A hyper-rectangle in global coordinates: [off, off + size) per axis. */
typedef struct flx_box {
	int64_t off[FLX_MAX_DIMS];
	int64_t size[FLX_MAX_DIMS];
} flx_box;

/*
 * One saved chunk.  A checkpoint can hold hundreds of thousands, so the
 * per-axis numbers are not inline FLX_MAX_DIMS arrays (mostly zeros): off,
 * size and stride point into the tensor's dims block, ndim each.
 */
typedef struct flx_chunk {
	int64_t *off;	 /* where the chunk sits in the tensor */
	int64_t *size;	 /* its extent */
	int64_t *stride; /* elements */
	uint32_t file;	 /* index into flx_ckpt.files */
	/* dims [contig_from, ndim) are dense row-major in storage (ndim:
	 * even the innermost is strided); see flx_chunk_contig_from() */
	int16_t contig_from;
	/* the item is one zstd frame (a "stream.zstd/1" transform):
	 * item_off/item_len are the frame's window in the file, and data_off
	 * is an offset into the frame's decompressed content, not the file.
	 * Such a chunk is read through resolver/cache/zcache.h, never spliced.
	 */
	bool zstd;
	/* stride is shared with other chunks (flx_tensor_pool_place()):
	 * change it with flx_chunk_set_strides() only */
	bool shared_stride;
	/* the chunk's window in that file: its item (a record holding it,
	 * such as a zip) or its data; the order in which items are read */
	uint64_t item_off;
	uint64_t item_len;
	uint64_t data_off;	/* absolute file offset of storage element 0 */
	int64_t storage_offset; /* elements, from data.pkl (0: none) */
} flx_chunk;

typedef struct flx_tensor {
	char *fqn;
	flx_dtype dtype;
	/* the dtype of the chunks' bytes when a cast of the transform stage
	 * made it differ from dtype (converted on read, reshard/cast.h);
	 * FLX_DT_INVALID: dtype, as every source gives */
	flx_dtype stored;
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	/* leading axes that stack modules rather than hold a parameter's
	 * elements: axis 0 indexes layers, the next (if any) experts.  Set by
	 * a source whose key convention says so ("decoder.layers." keys of
	 * one stacked module); 0 for every other tensor.  TP never splits these
	 * axes. */
	int stacked;
	/* the stacked axes start at the experts: one layer's key of a
	 * non-homogeneous model ("decoder.layers.<N>.mlp.experts.experts."),
	 * axis 0 indexes experts and no axis indexes layers */
	bool stacked_experts;
	/* the axis the source says the tensor was saved split along, plus
	 * one; -1: saved whole or replicated; 0: unknown, inferred from the
	 * chunks' offsets (reshard/plan.c).  Set where the chunks do not
	 * show the split: a flattened shard saved as several box chunks
	 * whose offsets differ along more than the split axis. */
	int saved_split;
	uint32_t nchunks;
	/* chunks[0..nchunks), then dims: per chunk, in chunk order, its
	 * ndim offsets, ndim sizes and ndim strides (one allocation, see
	 * flx_tensor_alloc_chunks()), or its ndim strides only, where the
	 * source keeps the boxes elsewhere in the index's pool
	 * (flx_tensor_pool_strides()), or t->shape, where the source keeps
	 * boxes and strides elsewhere (flx_tensor_pool_place()).  Either way
	 * the boxes are read in
	 * place: chunk i's off lies a fixed step past chunk i-1's, its size
	 * right behind it (reshard/view.c) */
	flx_chunk *chunks;
	int64_t *dims;
} flx_tensor;

/* A non-tensor value (saved as bytes): opaque bytes, a pickle archive in
 * practice. */
typedef struct flx_object {
	char *fqn;
	uint32_t file;
	uint64_t off;
	uint64_t len;
	/* the item is one zstd frame (as flx_chunk.zstd): [off, off + len)
	 * is the frame, and its decompressed content, zsize bytes, is the
	 * value */
	bool zstd;
	uint64_t zsize;
} flx_object;

/*
 * A fact of the source about its checkpoint, asked for by name
 * (flx_ckpt_fact()): whether the model has gated MLPs, a saving run's
 * setting, or the source's own description of the checkpoint (a pointer
 * whose type the source's plugin header names).  The core never knows
 * which facts exist; rules ("when") and layouts ask for them.
 */
typedef enum flx_fact_type {
	FLX_FACT_BOOL = 1,
	FLX_FACT_INT,
	FLX_FACT_TEXT,
	FLX_FACT_PTR,
} flx_fact_type;

typedef struct flx_fact {
	flx_fact_type type;
	union {
		bool b;
		int64_t i;
		const char *s; /* valid for the life of the index */
		const void *p; /* valid for the life of the index */
	} v;
} flx_fact;

typedef struct flx_ckpt {
	char *dir;	  /* as given */
	char *format;	  /* the source's name (flx_ckpt_format_name()) */
	char *writer;	  /* what wrote it: "torch >= 2.0 (...)" */
	int64_t mtime_ns; /* of its metadata file (.metadata, ...) */
	/* what everything served needs besides its own files: search on the
	 * checkpoint directory (its x bits, as read bits) and read of the
	 * metadata files the source read whole (flx_access_meet()) */
	flx_access access;
	size_t nfiles;
	flx_file *files; /* data files first, then extras */
	size_t ntensors;
	flx_tensor *tensors; /* in the source's order (.metadata's) */
	size_t nobjects;
	flx_object *objects;
	/* the source's own state (its description of the checkpoint beyond
	 * the tensors), in pool; and its answer to flx_ckpt_fact() (NULL: no
	 * facts).  An index derived from another (transformed, filtered) shares
	 * both. */
	const void *src_state;
	int (*src_fact)(const struct flx_ckpt *c, const char *name,
			flx_fact *out);
	/* internal: the files past the descriptor budget (fd -1), opened on
	 * use; NULL when every file keeps its descriptor from the open */
	struct flx_fdtable *fdt;
	/* where the remote files are read (flx_ckpt_opts.backend), or NULL */
	const flx_file_backend *backend;
	/* unique in the process, never 0 nor reused: names this checkpoint's
	 * file numbering for caches that outlive one read (slice.h, origin) */
	uint64_t uid;
	flx_tensor **by_name; /* internal: tensors sorted by FQN */
	/* extras that are symlinks and are not served (leading outside the
	 * directory without follow_symlinks, dangling, not to a regular
	 * file): their names, ", "-separated, and how many; NULL, 0: none */
	char *skipped_links;
	size_t nskipped_links;
	/* internal: when pooled (a loaded checkpoint), the tensors' and
	 * objects' names and the tensors' chunks live in pool, which
	 * flx_ckpt_close() frees whole; otherwise each is its own
	 * allocation (flx_tensor_alloc_chunks()) */
	bool pooled;
	flx_pool pool;
	/* internal: items still being read (flx_ckpt_open_start()) */
	struct flx_item_load *loading;
} flx_ckpt;

/* Options of an open; zero-initialise, then set what differs. */
typedef struct flx_ckpt_opts {
	/* the source to read it as (flx_ckpt_format_name()); NULL:
	 * the first source that recognises the directory */
	const char *format;
	/* threads that decode the metadata and read the items: 0 by size
	 * and CPUs; 1..8 exactly that many wherever there is work for them
	 * (tests: the outcome must not depend on it) */
	unsigned threads;
	/* return before the items are read: see flx_ckpt_open_start() */
	bool defer_items;
	/* resolve paths by the component walk alone, never openat2(), as
	 * on a kernel without it (tests: the outcome must not depend on it) */
	bool walk_only;
	/* the save directory's subdirectory the caller already entered and
	 * opens as the checkpoint (the distributed mount enters it itself),
	 * or NULL: flx_build_entered() reports it as if entered here; not
	 * owned */
	const char *entered;
	/* the plugins' option values (the sources' own options, opt.h),
	 * read by the source by name; NULL: none given.  Borrowed. */
	const struct flx_opt_vals *vals;
	/* symlinks that lead outside the directory (a model cache
	 * snapshot's links into ../../blobs/) are followed too; without
	 * it such a data file is an error and such an extra is skipped
	 * (flx_ckpt.skipped_links) */
	bool follow_symlinks;
	/* keep at most this many files' descriptors from the open, and give
	 * the fd table 4 slots (tests: the outcome must not depend on it);
	 * 0: by RLIMIT_NOFILE, see flx_file_acquire() */
	unsigned keep_fds;
	/* files the checkpoint names that the directory lacks come from
	 * here (flx_file.remote), and so does a metadata file the source
	 * reads whole; NULL: a missing file is an error */
	const flx_file_backend *backend;
	/* the placement rules' word on a tensor's split, asked by a source
	 * that merges saved tensor-parallel slices of one tensor (NULL: no
	 * rules): 0 and *axis (-1: replicated; else the axis the slices are
	 * concatenated along, in rank order), -ENOENT when no rule states a
	 * split for fqn, -EOPNOTSUPP when the rule places the axis in parts
	 * ("groups").  Called on the loading thread during the load only;
	 * ctx is split_ctx, borrowed. */
	int (*split_rule)(const void *ctx, const char *fqn, int *axis);
	const void *split_ctx;
} flx_ckpt_opts;

/**
 * Open and validate a checkpoint directory, of any source format.  Not
 * recognised by any source: -ENOENT naming the first source's marker file.
 * @param o  options; NULL for the defaults.
 * @return 0 and *out (owned; flx_ckpt_close()), or -errno with err naming
 *         the file, the key and the reason.
 */
int flx_ckpt_open_with(const char *dir, const flx_ckpt_opts *o, flx_ckpt **out,
		       flx_error *err);

/** The name of source i, in probe order (the values flx_ckpt_opts.format
 * accepts), or NULL past the last.  Thread-safe. */
const char *flx_ckpt_format_name(size_t i);

/** flx_ckpt_open_with() with the default options. */
int flx_ckpt_open(const char *dir, flx_ckpt **out, flx_error *err);

/**
 * flx_ckpt_open() in two steps (o->defer_items), so that the caller can
 * plan and build its namespace while the items (the longest part of a
 * large open) are read on other threads.  flx_ckpt_open_start() fails as
 * flx_ckpt_open() would on everything but the items.  Until
 * flx_ckpt_finish(), the caller may use everything except what the items
 * give, a chunk's data_off, storage_offset, stride and contig_from, and
 * may not read.  flx_ckpt_finish() waits for the items: 0, or -errno with
 * err as flx_ckpt_open() would have failed (then only flx_ckpt_close()
 * remains); 0 at once after flx_ckpt_open() or a finished open, or for a
 * source without items.  Not thread-safe against itself or
 * flx_ckpt_close(), which waits for unfinished items.
 */
int flx_ckpt_open_start(const char *dir, flx_ckpt **out, flx_error *err);
int flx_ckpt_finish(flx_ckpt *c, flx_error *err);

/**
 * Raise this process's RLIMIT_NOFILE soft limit to its hard limit: an open
 * checkpoint holds one descriptor per file it reads (torch 1.13 writes one
 * file per item), so the usual soft limit of 1024 would refuse a checkpoint
 * the hard limit allows.  For programs' start (the mount, flexfs-inspect),
 * before threads; a library call never changes limits by itself.
 * @return 0 (also when already at the hard limit), or -errno.
 */
int flx_nofile_raise(void);

/* The fd table's side of flx_file_acquire()/flx_file_release(). */
int flx_fdtable_acquire(const flx_ckpt *c, uint32_t i, int *fd);
void flx_fdtable_release(const flx_ckpt *c, uint32_t i);

/**
 * A descriptor of file i to read from, valid until flx_file_release(c, i).
 * Files keep the descriptor they were opened with at mount while the
 * process's RLIMIT_NOFILE allows (all but a reserve for FUSE and threads);
 * that path is a load and nothing to release.  The files past that are
 * opened on use, below the checkpoint directory as at mount, and their
 * identity (size, mtime, ctime, device, inode) compared with the one
 * recorded at mount; a bounded number stays open, the least recently used
 * of those no caller holds closed first.  Thread-safe.
 * @return 0 and *fd; -ESTALE (the file changed), -EREMOTE (a remote
 *         file: read it with flx_file_pread()/flx_file_read_spans()), or
 *         -errno (cannot open: -EMFILE past the limit even so).
 */
static inline int flx_file_acquire(const flx_ckpt *c, uint32_t i, int *fd)
{
	if (c->files[i].fd >= 0) {
		*fd = c->files[i].fd;
		return 0;
	}
	return flx_fdtable_acquire(c, i, fd);
}

/** Give back what flx_file_acquire(c, i) returned 0 for.  Thread-safe. */
static inline void flx_file_release(const flx_ckpt *c, uint32_t i)
{
	if (c->files[i].fd < 0)
		flx_fdtable_release(c, i);
}

/** n bytes at off of file i, whole (flx_file_acquire(), pread, release;
 * a remote file through the backend).
 * @return 0, -EIO at end of file, or the error of the acquire or the
 *         read.  Thread-safe. */
int flx_file_pread(const flx_ckpt *c, uint32_t i, void *buf, size_t n,
		   uint64_t off);

/** flx_file_pread() into the iov buffers, in order, from off (iov is
 * modified).  @return as flx_file_pread().  Thread-safe. */
struct iovec;
int flx_file_preadv(const flx_ckpt *c, uint32_t i, struct iovec *iov,
		    int iovcnt, uint64_t off);

/** Every span of a batch whole, the remote ones with one backend call
 * (coalesced and overlapped there).  @return 0, or the first error.
 * Thread-safe. */
int flx_file_read_spans(const flx_ckpt *c, const flx_file_span *s, size_t n);

/* A reader (resolver/common/reader.h) over a window of file i of c. */
typedef struct flx_file_reader {
	const flx_ckpt *c;
	uint32_t file;
	uint64_t base;
} flx_file_reader;

struct flx_reader;
/** Reader over bytes [base, base+len) of file i of c, read by
 * flx_file_pread() (a remote file too); ctx must outlive the reader. */
void flx_reader_file(struct flx_reader *r, flx_file_reader *ctx,
		     const flx_ckpt *c, uint32_t i, uint64_t base,
		     uint64_t len);

/** Whether file i is read through the backend (no descriptor). */
static inline bool flx_file_is_remote(const flx_ckpt *c, uint32_t i)
{
	return c->files[i].remote;
}

/**
 * The source that would read dir (its probe, in flx_sources[] order), as
 * flx_ckpt_opts.format accepts it; for a node that must agree with others
 * on the format before they open it together.  Thread-safe.
 * @return 0 and *format (static), -ENOENT when no source recognises it,
 *         or -errno (cannot open or look).
 */
int flx_ckpt_probe(const char *dir, const char **format);

/**
 * Store value for the option name of one of the sources (flx_source.opts)
 * in vals, as the option parser does: for callers that open a checkpoint
 * without the registry (tests, tools).
 * @return 0, -ENOENT (no source has that option; err untouched), or as
 *         flx_opt_vals_set().
 */
int flx_ckpt_opt_set(flx_opt_vals *vals, const char *name, const char *value,
		     flx_error *err);

/**
 * The fact name of c's source (flx_fact), asked of the source's hook.
 * Thread-safe.
 * @return 0 and *out, or -ENOENT when the source does not know it (or
 *         has no facts), or -ENODATA when it is a fact of the source that
 *         this checkpoint does not tell: *out is then a FLX_FACT_TEXT
 *         saying why and which option states it (docs/facts.md).
 */
int flx_ckpt_fact(const flx_ckpt *c, const char *name, flx_fact *out);

/** Whether c's source says fact name is a true bool (false when it
 * does not know it or the checkpoint does not tell it).  Thread-safe. */
bool flx_ckpt_fact_true(const flx_ckpt *c, const char *name);

/** The pointer fact name of c (the source's own description), or NULL
 * when the source has none by that name.  Thread-safe. */
const void *flx_ckpt_fact_ptr(const flx_ckpt *c, const char *name);

/** Release everything (closes fds); NULL is fine. */
void flx_ckpt_close(flx_ckpt *c);

/** The dtype t's chunks hold (see flx_tensor.stored). */
static inline flx_dtype flx_tensor_stored(const flx_tensor *t)
{
	return t->stored ? t->stored : t->dtype;
}

/** Tensor by FQN (binary search on an internal index), or NULL.
 * Thread-safe. */
const flx_tensor *flx_ckpt_find(const flx_ckpt *c, const char *fqn);

/**
 * Check that a backing file still is what was validated at mount.
 * Always: fstat() of the open descriptor shows the same size, mtime,
 * ctime, device and inode (a file truncated or rewritten in place, even
 * with its mtime put back: the kernel moves ctime on every write and on
 * every utimensat()).  With by_path: the path also
 * still names the same inode (a file replaced by rename); this check is
 * skipped if it passed less than a second ago.  Thread-safe.
 * @return 0, or -ESTALE when the file changed (-errno if stat fails).
 */
int flx_file_verify(const flx_ckpt *c, const flx_file *f, bool by_path);

/**
 * How a backing file differed the last time the calling thread found one
 * changed (flx_file_verify() or a reopen past the descriptor budget
 * returning -ESTALE): "RELPATH: REASON" into buf (len bytes, cut to fit),
 * "" when none since the last call, which it clears (len 0, buf
 * NULL: only clears).  Thread-safe (one
 * record per thread).
 */
void flx_file_changed_why(char *buf, size_t len);

struct stat;

/**
 * The access st gives: its owner, group and read bits; for a directory its
 * search (x) bits, moved to the read bits' places (what reading a file in it
 * by name needs).  Thread-safe.
 */
flx_access flx_access_of(const struct stat *st);

/**
 * Narrow *a to what b allows too, so that whoever *a then lets read could
 * read both; a's owner and group stay.  A class of a keeps its read bit
 * when b gives it to every user that class can be to b: with the same
 * owner and group that is b's bit of the same class (read bits met class
 * by class); where they differ, a user may be b's owner, in b's group or
 * neither, and must be able to read b as each.  Thread-safe (on distinct
 * *a).
 */
void flx_access_meet(flx_access *a, const flx_access *b);

/** Record st (an fstat of f's fd) as f's identity at mount: size, device,
 * inode, mtime, ctime (and its access); what flx_file_verify() compares
 * against.  For those who
 * build an index by hand (tests). */
void flx_file_identity(flx_file *f, const struct stat *st);

/**
 * Allocate n zeroed chunks for t (t->ndim set, t->chunks NULL) with their
 * dims block, and point each chunk's off/size/stride into it, for an index
 * built by hand (pooled false).  Freed with free(t->chunks).
 * @return 0, or -ENOMEM (t unchanged).
 */
int flx_tensor_alloc_chunks(flx_tensor *t, uint32_t n);

/**
 * How far chunk ch of an ndim-dimensional tensor is stored dense row-major,
 * from the innermost dimension out, given its size and stride: the value
 * of flx_chunk.contig_from.  Dimensions of extent 1 never break density,
 * whatever their stride.  Thread-safe.
 */
int flx_chunk_contig_from(int ndim, const flx_chunk *ch);

#endif
