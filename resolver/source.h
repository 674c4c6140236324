/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_SOURCE_H
#define FLX_RESOLVER_SOURCE_H

/*
 * Internal: how a checkpoint format (a "source") fills the global index.
 *
 * flx_ckpt_open_with() (index.c) opens the directory, asks each source of
 * flx_sources[] in turn whether it recognises it (probe), and hands the
 * first that does a builder (load).  The source decodes its own metadata
 * and fills the flx_ckpt: format-specific checks and messages are its
 * own.  The builder owns everything that does not depend on the format:
 *
 *  - the file table: every file is opened inside the directory (symlinks
 *    followed only while they stay inside), once per path, and its
 *    identity recorded (flx_build_data_file());
 *  - the chunks of each tensor: inside the global shape, pairwise
 *    disjoint, covering it (flx_tensor_check_chunks());
 *  - the items, when a chunk's data must be found by reading a record in
 *    its file: read in file order on worker threads (flx_build_items());
 *  - a read-ahead of small files while the metadata is decoded
 *    (flx_build_prefetch());
 *  - after load: the other regular files of the directory (extras, passed
 *    through unchanged), the name index and the uniqueness of names.
 *
 * Errors: the first failure in the order a single pass would meet it is
 * the one reported: what load reports, then an item, then an extra or a
 * repeated name.  Paths in err->file are relative to the directory; the
 * builder prefixes the directory on the way out.
 *
 * Thread-safety: a builder is used by one thread (the source's own worker
 * threads call only the functions marked thread-safe).
 */

#include "ckpt.h"
#include "opt.h"
#include "pickle.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct stat;

typedef struct flx_build flx_build;

/* What a path is, as an enter hook sees it (symlinks: see flx_dirview). */
typedef enum flx_dv_kind {
	FLX_DV_NONE,  /* absent */
	FLX_DV_FILE,  /* a regular file (a symlink to one, locally) */
	FLX_DV_DIR,   /* a directory, not a symlink */
	FLX_DV_OTHER, /* present, neither, or not looked at (an error) */
} flx_dv_kind;

/*
 * The directory an enter hook looks at: the local one (the builder's,
 * flx_dirview_local()) or the union of the ranks' files
 * (resolver/remote/mpi_mount.c), where a directory is any path some rank
 * holds a file under.  Paths are relative, '/'-separated, plain.  The
 * ranks' view is collective: every rank calls the same functions with
 * the same arguments in the same order, which hooks do as long as they
 * decide only from what the view gave them.
 */
typedef struct flx_dirview {
	void *ctx;	   /* the ranks' view's state */
	int dirfd;	   /* the local view's directory */
	flx_build *b;	   /* the local view's builder, or NULL */
	const char *where; /* for messages: "here", "on any rank" */
	flx_dv_kind (*kind)(const struct flx_dirview *v, const char *path);
	/* fn(arg, name) for each directory (not hidden) among the first max
	 * entries of the top directory, until fn returns nonzero.
	 * @return what fn returned last, or -errno */
	int (*each_dir)(const struct flx_dirview *v, unsigned max,
			int (*fn)(void *arg, const char *name), void *arg);
	/* The regular file path whole, at most max bytes (a power of two),
	 * as flx_build_read_whole() reads it.  @return 0 and *buf (owned;
	 * free(), NUL past its end), *len; or -errno with err naming path */
	int (*read)(const struct flx_dirview *v, const char *path, uint64_t max,
		    void **buf, size_t *len, flx_error *err);
} flx_dirview;

/**
 * The view of the builder's directory (b NULL: of dirfd alone, whose
 * read fails with -ENOTSUP).  v borrows dirfd and b.
 */
void flx_dirview_local(flx_dirview *v, int dirfd, flx_build *b);

/**
 * fn(arg, name, dir) for each of the first max entries of directory dirfd
 * (hidden ones counted, never passed), dir true for a directory (not a
 * symlink to one), until fn returns nonzero.  Thread-safe.
 * @return what fn returned last, or -errno (the directory's listing).
 */
int flx_each_local_name(int dirfd, unsigned max,
			int (*fn)(void *arg, const char *name, bool dir),
			void *arg);

/**
 * fn(arg, name, dir) over the relative paths name_at(ctx, 0),
 * name_at(ctx, 1), ... up to the first NULL, sorted in strcmp() order (a
 * subdirectory's paths adjacent): each path at the top (no '/': dir
 * false) and each top-level subdirectory some path lies under, once (dir
 * true; one longer than longest bytes, and than PATH_MAX - 1, passed
 * over), at most max_dirs of them.  Hidden names (a leading '.') never.
 * Until fn returns nonzero.  name is valid during the call only.
 * Thread-safe where name_at is.
 * @return what fn returned last, 0 when never called.
 */
int flx_each_listed_name(const char *(*name_at)(void *ctx, uint32_t i),
			 void *ctx, size_t longest, unsigned max_dirs,
			 int (*fn)(void *arg, const char *name, bool dir),
			 void *arg);

/**
 * As flx_each_listed_name(), fn(arg, name) for the subdirectories only:
 * a flx_dirview.each_dir over a list of paths.
 * @return what fn returned last, 0 when never called.
 */
int flx_each_listed_dir(const char *(*name_at)(void *ctx, uint32_t i),
			void *ctx, size_t longest, unsigned max,
			int (*fn)(void *arg, const char *name), void *arg);

/**
 * The subdirectory holding the checkpoint when v is a save directory:
 * the enter hooks of the sources (only the one o->format names, when
 * set), in table order, the first that names one.  @return 0 and sub
 * (cap bytes; "" when none), or -errno with err set.
 */
int flx_source_enter(const flx_dirview *v, const flx_ckpt_opts *o, char *sub,
		     size_t cap, flx_error *err);

/** Whether relpath is some source's metadata file (flx_source.metadata).
 * Thread-safe. */
bool flx_source_metadata(const char *relpath);

typedef struct flx_source {
	const char *name;   /* flx_ckpt.format: "torch-dcp" */
	const char *kind;   /* for messages: "PyTorch DCP" */
	const char *marker; /* what probe looks for, for messages */
	/* a variant of another source (a DCP directory with files of its
	 * own): probed before it; when no source recognises a directory the
	 * message is named after the first plain source and lists the
	 * others' markers (sources sharing a marker, adjacent in the table,
	 * once) */
	bool variant;
	/* Whether the directory dirfd holds this source's checkpoint; looks,
	 * never reads a payload.  @return 0 and *yes, or -errno. */
	int (*probe)(int dirfd, bool *yes);
	/* NULL, or probe as an open asks it, over flx_build_dirfd(b): the
	 * same answer, and what it found on the way may be kept for load
	 * (flx_build_keep()), which then need not look again.  The open
	 * drops what a probe that says no kept.  @return 0 and *yes, or
	 * -errno. */
	int (*probe_open)(flx_build *b, bool *yes);
	/* Whether a directory entry is one of the source's own files (never
	 * passed through as an extra; hidden files never are).  Files load
	 * recorded are own files whatever this says. */
	bool (*owns)(const char *name);
	/* Fill flx_build_ckpt(b): writer, mtime_ns, tensors (names and
	 * chunks from its pool), objects, through the builder's functions
	 * below.  @return 0, or -errno with err set (the builder's err). */
	int (*load)(flx_build *b, const flx_ckpt_opts *o, flx_error *err);
	/* NULL, or: whether the directory v holds the checkpoint one level
	 * down (a save directory whose tracker file names the iteration to
	 * read), asked of every source with the hook (only the one
	 * o->format names, when set) before any probe, locally or over the
	 * ranks' files.  Into sub (cap bytes) the subdirectory's name, a
	 * plain name that v has as a directory, or "" when the directory is
	 * not such a one.  The builder then reads the subdirectory as the
	 * checkpoint directory (flx_build_entered()).  @return 0, or -errno
	 * with err set (a tracker that names nothing readable). */
	int (*enter)(const flx_dirview *v, const flx_ckpt_opts *o, char *sub,
		     size_t cap, flx_error *err);
	/* NULL, or a glob (fnmatch(), no flags) of the relpaths of the
	 * metadata files every open of the checkpoint reads whole: the
	 * distributed mount broadcasts them at start (flx_source_metadata()) */
	const char *metadata;
	/* NULL, or the source's own options ("-o NAME=VALUE"): their
	 * values reach load in o->vals, read by name (flx_opt_u64() ...).
	 * Sources that share options point at the same group. */
	const flx_opt_group *opts;
	/* NULL, or the source's facts: load sets flx_ckpt.src_state, and
	 * the builder sets flx_ckpt.src_fact to this hook.  @return 0 and
	 * *out, or -ENOENT for a name the source does not know.
	 * Thread-safe. */
	int (*fact)(const flx_ckpt *c, const char *name, flx_fact *out);
	/* NULL, or the names of the source's bool facts, NULL-terminated:
	 * what a rule's "when" may name (flx_fact_known()) */
	const char *const *facts;
} flx_source;

/* The sources, in probe order, NULL-terminated (sources.c). */
extern const flx_source *const flx_sources[];

/** Whether some source declares a bool fact named name (flx_source.facts).
 * Thread-safe. */
bool flx_fact_known(const char *name);

/** The n-th fact name (from 0) that some source declares, each once, or
 * NULL past the last; for messages listing them.  Thread-safe. */
const char *flx_fact_name(size_t n);

/** The index being built (format already set): the source fills the
 * rest.  Tensors' and objects' names and chunks go in its pool
 * (flx_ckpt_close() frees it whole); files only through the builder. */
flx_ckpt *flx_build_ckpt(flx_build *b);

/** Keep p, what a probe_open hook found, for the source's load
 * (flx_build_take()); the builder frees it with fn (when not NULL) if
 * load does not take it.  A second keep frees the first. */
void flx_build_keep(flx_build *b, void *p, void (*fn)(void *));

/** What the source's probe_open kept (flx_build_keep()), now the
 * caller's, or NULL: none kept (the open was told the format, or the hook
 * kept nothing). */
void *flx_build_take(flx_build *b);

/** The checkpoint directory, open O_RDONLY | O_DIRECTORY; the builder
 * owns it.  Look up names with *at() only under symlink-free rules (or
 * through flx_build_open()). */
int flx_build_dirfd(const flx_build *b);

/** The subdirectory a source's enter hook led the open into
 * ("iter_0000100", "release"), or NULL when the directory given is the
 * checkpoint directory.  Valid for the life of the builder. */
const char *flx_build_entered(const flx_build *b);

/**
 * Open relpath (relative to the directory) read-only, resolved below the
 * directory's descriptor (openat2() RESOLVE_BENEATH, else a component walk
 * with O_NOFOLLOW): no directory swapped during the lookup can lead
 * outside.  Symlinks, in any component, are followed only while the
 * resolved path stays inside the directory.  The type is looked at before
 * anything is opened for reading: only a regular file is, with O_RDONLY |
 * O_NONBLOCK | O_NOCTTY | O_CLOEXEC, so a FIFO or a device is never opened
 * (a FIFO never blocks).  Thread-safe.
 * @return 0 with *st (the object's fstat) and *fd: open for reading
 *         (owned by the caller) when *st is a regular file, else -1; or
 *         -EXDEV when it resolves outside, -ESTALE when the file changed
 *         between the look and the open, or -errno.  Nothing is recorded
 *         in err.
 */
int flx_build_open(flx_build *b, const char *relpath, int *fd, struct stat *st);

/**
 * Read a source's own metadata file whole: opened as flx_build_open()
 * does, a regular file of at most max bytes (a power of two: messages
 * name it in KiB/MiB/GiB), into a buffer with a NUL byte past its end
 * (text parsers may rely on it); a large one is offered to transparent
 * huge pages.  missing: what to say when relpath does not exist (NULL:
 * the system's message).
 * @return 0 and *buf (owned; free()), *len and *mtime_ns (the file's
 *         mtime), or -errno with err naming relpath: -EINVAL (outside the
 *         directory, not a regular file, too large), -ENOENT, -ENOMEM,
 *         or the open's or read's error.
 */
int flx_build_read_whole(flx_build *b, const char *relpath, uint64_t max,
			 const char *missing, void **buf, size_t *len,
			 int64_t *mtime_ns, flx_error *err);

/**
 * Open a source's own metadata file for a parser that reads it forward
 * through a reader (flx_reader_fd()) instead of whole: the same lookup,
 * checks and messages as flx_build_read_whole(), and the same effect on
 * the index (the file's owner and group), without reading a byte.
 * @return 0 with *fd (open, owned by the caller), *size (<= max) and
 *         *mtime_ns; -EREMOTE, nothing in err, when the file is one the
 *         remote backend serves (read it with flx_build_read_whole());
 *         or flx_build_read_whole()'s -errno with err.
 */
int flx_build_open_whole(flx_build *b, const char *relpath, uint64_t max,
			 const char *missing, int *fd, uint64_t *size,
			 int64_t *mtime_ns, flx_error *err);

/* Attempt k of a streamed decode (flx_build_load_pickle()): r decoded
 * with lim by a sink load of the source's.  @return 0 and *pk, -EAGAIN to
 * go on, or another -errno (err set). */
typedef int (*flx_pickle_attempt)(void *ctx, unsigned k, const flx_reader *r,
				  const flx_pickle_limits *lim,
				  flx_pickle **pk);

/**
 * Decode a source's metadata pickle relpath, found and checked as
 * flx_build_open_whole() does (max, missing, *mtime_ns alike).  A local
 * file is read forward through a window, every payload copied (at most
 * max bytes), so that the tree and the messages are a buffer load's:
 * attempt(ctx, k, ...) for k = 0 .. nattempt - 1 while it returns
 * -EAGAIN, reset(ctx) and err cleared after each, then a plain reader
 * load.  A file the remote backend serves is read whole and decoded as a
 * tree.  @return 0 and *pk (owned: flx_pickle_free()), or -errno with err.
 */
int flx_build_load_pickle(flx_build *b, const char *relpath, uint64_t max,
			  const char *missing, int64_t *mtime_ns,
			  unsigned nattempt, flx_pickle_attempt attempt,
			  void (*reset)(void *ctx), void *ctx, flx_pickle **pk,
			  flx_error *err);

/* Who names a data file, for its error messages. */
typedef struct flx_file_ref {
	const char *from;  /* the file that names it: ".metadata" */
	const char *field; /* how it names it: "relative_path" */
	const char *key;   /* the tensor or value that needs it (or NULL) */
} flx_file_ref;

/**
 * Record a data file (one the source reads tensors or values from) in
 * the index, open and checked once per path: a plain relative path
 * without "." or ".." components, inside the directory, a regular file.
 * @return 0 and *idx (into flx_build_ckpt(b)->files, valid for the life
 *         of the index), or -errno with err: "<from>: <key>: <field> '...'
 *         leaves the checkpoint directory", or naming relpath: resolves
 *         outside (symlink), cannot open, not a regular file.
 */
int flx_build_data_file(flx_build *b, const char *relpath,
			const flx_file_ref *ref, uint32_t *idx);

/** Whether the index's file backend (flx_ckpt_opts.backend) serves
 * relpath, a file the directory lacks: flx_build_data_file() then records
 * it as a remote file.  Thread-safe. */
bool flx_build_remote(const flx_build *b, const char *relpath);

/** Whether directory dirfd has name, of any type (a symlink not
 * followed), or cannot tell (a lookup error other than ENOENT): a
 * probe's test for a marker file.  Thread-safe. */
bool flx_dir_has(int dirfd, const char *name);

/** flx_dir_has(dirfd, name), or the index's file backend serves name
 * (flx_build_remote()): the checkpoint has it, here or on another node.
 * Thread-safe. */
bool flx_build_has(const flx_build *b, int dirfd, const char *name);

/** The relpath of the index's file backend's file id (0, 1, ...: every
 * file any node holds, this one's too), or NULL past the last or without
 * a backend: a source that picks its files by listing the directory
 * lists these too.  Valid for the life of the backend.  Thread-safe. */
const char *flx_build_remote_name(const flx_build *b, uint32_t id);

/**
 * fn(arg, name, dir) for each name at the top of the directory, for a
 * source that picks its files by listing: with a file backend every
 * node's files (flx_build_remote_name()): those at the top (dir false),
 * and each subdirectory some node holds a file under, once (dir true);
 * else the directory's entries, dir true for a directory (not a symlink).
 * Hidden names never.  Until fn returns nonzero.  What a file is, is found
 * when it is opened (flx_build_data_file()).
 * @return what fn returned last, or -errno (the directory's listing).
 */
int flx_build_each_name(flx_build *b,
			int (*fn)(void *arg, const char *name, bool dir),
			void *arg);

/**
 * Record fd, a memory file (memfd) the source filled with bytes it decoded
 * at mount, as a data file named name (for messages; never looked up or
 * verified by path, only by its descriptor).  The index owns fd from the
 * call on, also on failure.
 * @return 0 and *idx, or -ENOMEM / the fstat's -errno (fd closed).
 */
int flx_build_decoded_file(flx_build *b, const char *name, int fd,
			   uint32_t *idx);

/** Plain relative path: not empty, not absolute, no empty, "." or ".."
 * component.  Thread-safe. */
bool flx_relpath_ok(const char *relpath);

/**
 * Allocate n zeroed chunks of t (t->ndim set) and their dims block from
 * pool, and point each chunk's off/size/stride into it; t->nchunks = n.
 * Thread-safe for distinct pools.  @return 0 or -ENOMEM.
 */
int flx_tensor_pool_chunks(flx_pool *pool, flx_tensor *t, uint32_t n);

/**
 * As flx_tensor_pool_chunks() (t->ndim > 0), with room for the strides
 * only: each chunk's off and size are NULL, for the caller to point at
 * t->ndim offsets followed by t->ndim sizes that it keeps as long as the
 * index (in the index's pool: flx_pool_adopt()), where a source has them
 * already: chunk i's off a fixed step past chunk i-1's, as
 * flx_tensor.dims says.  Thread-safe for distinct pools.  @return 0, -EINVAL
 * (ndim 0) or -ENOMEM.
 */
int flx_tensor_pool_strides(flx_pool *pool, flx_tensor *t, uint32_t n);

/**
 * Give t the n chunks the source made already, ch[0..n) (kept by the
 * caller as long as the index, in its pool: flx_pool_adopt()), their off
 * and size pointed at boxes as flx_tensor_pool_strides() says (t->ndim 0:
 * pointed here at t->shape, no element read) and checked
 * (flx_tensor_check_chunks()).  Each chunk's strides are set to those of
 * its size stored dense row-major, one array from pool shared by the
 * chunks in a row whose sizes give the same (shared_stride set): an item
 * loader that reads other strides sets them with flx_chunk_set_strides().
 * Other fields are left as they are.  Thread-safe for distinct pools.
 * @return 0 or -ENOMEM.
 */
int flx_tensor_pool_place(flx_pool *pool, flx_tensor *t, flx_chunk *ch,
			  uint32_t n);

/**
 * Strides want (ndim) as chunks share them: last when it holds the same
 * (the previous chunk's), else a copy from pool.  Thread-safe for distinct
 * pools.  @return the array to point at, or NULL (out of memory).
 */
int64_t *flx_strides_share(flx_pool *pool, int ndim, const int64_t *want,
			   int64_t *last);

/**
 * Set chunk ch's ndim strides to stride: in place, or, when they are
 * shared (flx_chunk.shared_stride) and differ, in an array of its own from
 * keep.  Thread-safe for distinct chunks and pools.
 * @return 0 or -ENOMEM (ch unchanged).
 */
int flx_chunk_set_strides(flx_chunk *ch, int ndim, const int64_t *stride,
			  flx_pool *keep);

/**
 * Check that t's chunks lie inside its shape, are pairwise disjoint and
 * cover it.  from names the file that described them, in messages.
 * Thread-safe (touches only t and err).
 * @return 0, -EINVAL with err, or -ENOMEM.
 */
int flx_tensor_check_chunks(const flx_tensor *t, const char *from,
			    flx_error *err);

/*
 * The items: for sources whose chunk data must be located by reading a
 * record in the file (DCP's torch.save items), the builder calls load
 * once per chunk after the source's load, in file order (by file, then
 * item_off), from up to 8 threads, each with its own scratch.  load may
 * write only *ch, and take memory that lives as long as the index from
 * keep (the worker's own pool, given to the index's when the items are
 * read).  Until they are read (flx_ckpt_open_start()) the caller of the
 * open may use everything but what load fills.
 */
typedef struct flx_item_ops {
	size_t scratch_size;
	/* @return 0 or -errno; on failure too, s is left for release */
	int (*scratch_init)(void *s);
	void (*scratch_release)(void *s);
	/* @return 0, or -errno with err (one per worker) */
	int (*load)(const flx_ckpt *c, void *s, const flx_tensor *t,
		    flx_chunk *ch, flx_pool *keep, flx_error *err);
} flx_item_ops;

/** Have every chunk's item read through ops (static storage). */
void flx_build_items(flx_build *b, const flx_item_ops *ops);

/** Start reading ahead (POSIX_FADV_WILLNEED) the small regular files of
 * the directory whose name want() accepts, on a thread that ends before
 * the open returns.  Only a hint: failures are ignored. */
void flx_build_prefetch(flx_build *b, bool (*want)(const char *name));

/** Name the place a repeated tensor or value name is reported against:
 * "<from>: <name>: listed twice in <where>". */
void flx_build_names_from(flx_build *b, const char *from, const char *where);

/**
 * Run fn(parts + k * size) for k in [0, n), n <= FLX_MAX_THREADS: k = 0
 * on this thread, the others on their own threads (one that cannot start
 * runs here), and return when all have.  Allocates nothing.
 */
#define FLX_MAX_THREADS 8
void flx_run_parts(void *parts, size_t size, unsigned n, void *(*fn)(void *));

/**
 * How many parts (threads) for n things, per a part: n / per, at most the
 * CPUs online; or force when non-zero (flx_ckpt_opts.threads: tests run
 * the error corpus that way, and the outcome must not depend on it).
 * Never more than n or FLX_MAX_THREADS, never 0.  Thread-safe.
 */
unsigned flx_part_count(unsigned force, size_t n, size_t per);

/** st's mtime in nanoseconds. */
int64_t flx_mtime_ns(const struct stat *st);

#endif
