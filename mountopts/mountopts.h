/* SPDX-License-Identifier: MIT */
#ifndef FLX_MOUNTOPTS_MOUNTOPTS_H
#define FLX_MOUNTOPTS_MOUNTOPTS_H

/*
 * Mount-option layer: everything between argv / "-o a,b,c" and the two
 * consumers (the target spec and libfuse).  Pure string logic, no FUSE
 * headers, so it is unit-tested without a mount and shared with
 * flexfs-inspect.
 *
 * Every "-o" token falls in exactly one class:
 *   ours   an option of a table (flx_mo_group()): the view's (tp, pp,
 *          rules, ...: applied to the spec with flx_spec_set()), the
 *          open's (source_format, follow_symlinks: flx_ckpt_opts), the
 *          mount's (read_ahead_kb, direct_io, ..., gpu*, mpi*: kept in
 *          flx_mountopts for the FUSE adapter), or a plugin's (stored in
 *          spec.opts, read by the plugin by name: opt.h);
 *   fstab  auto, noauto, user, nouser, users, _netdev, nofail, defaults,
 *          user=*, comment=*, x-*: bookkeeping of mount(8)/fstab/systemd
 *          that libfuse would reject ("unknown option"), dropped;
 *   rw/ro  accepted (fstab "defaults" reaches helpers as "rw") and dropped:
 *          the mount is always read-only;
 *   fuse   everything else, handed to libfuse, which owns the error for
 *          names it does not know.
 */

#include "ckpt.h"
#include "slice.h"
#include "spec.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FLX_MO_SUBTYPE "flexfs"

/* Readahead of the mount's own bdi, in KiB: FLX_MO_READ_AHEAD_AUTO (the
 * FUSE adapter picks) unless -o read_ahead_kb= says otherwise (0: the
 * kernel's).  The kernel's default, 128 KiB, makes every FUSE read request
 * 128 KiB whatever max_pages allows (docs/performance.md measures it). */
#define FLX_MO_READ_AHEAD_AUTO	 UINT_MAX
#define FLX_MO_READ_AHEAD_KB_MAX (1024 * 1024)

/* push_ahead_kb= bound (KiB pushed after a read that lands in a tensor)
 * and its default (0: off). */
#define FLX_MO_PUSH_AHEAD_KB_MAX     (1024 * 1024)
#define FLX_MO_PUSH_AHEAD_KB_DEFAULT 0

/* cache_size= bounds: 0 (off) or from one 1 MiB block up to 1 TiB (a
 * typo's 64T would only fail later, one block at a time).  Unset, the
 * mount sizes it (flx_mo_cache_bytes()): at least FLX_MO_CACHE_FLOOR, at
 * most FLX_MO_CACHE_AUTO_MAX or an eighth of the memory. */
#define FLX_MO_CACHE_AUTO     UINT64_MAX
#define FLX_MO_CACHE_FLOOR    (64ull << 20)
#define FLX_MO_CACHE_AUTO_MAX (4ull << 30)
#define FLX_MO_CACHE_MIN      (1ull << 20)
#define FLX_MO_CACHE_MAX      (1ull << 40)

typedef enum flx_mo_class {
	FLX_MO_OURS = 0,
	FLX_MO_FSTAB,
	FLX_MO_RWRO,
	FLX_MO_FUSE,
} flx_mo_class;

typedef struct flx_mountopts {
	flx_spec spec; /* what "ours" tokens set; the plugins' options in
			* spec.opts */
	char *source;  /* checkpoint directory (owned), NULL until set */
	/* source_format=: the source to read it as (a flx_ckpt_opts.format,
	 * owned); NULL: detected from the directory */
	char *source_format;
	char **fuse; /* "fuse" tokens in order, unescaped (owned) */
	size_t nfuse;
	bool has_fsname;  /* the user gave fsname= */
	bool has_subtype; /* the user gave subtype= */
	/* read_ahead_kb= (0: leave the kernel's value, AUTO: the adapter's
	 * choice); ra_given: the user set it, so failing to apply it
	 * deserves a message. */
	unsigned read_ahead_kb;
	bool ra_given;
	/* direct_io[=0|1]: files are opened FOPEN_DIRECT_IO (read() bypasses
	 * the kernel's page cache; mmap still goes through it). */
	bool direct_io;
	/* passthrough[=0|1]: an open file that is the whole of one backing
	 * file (flx_fs_whole_file()) is read by the kernel from that file
	 * (FUSE passthrough): no request reaches the daemon, and a backing
	 * file rewritten in place after the open is served as it then is
	 * instead of failing, hence off by default. */
	bool passthrough;
	/* push_ahead_kb=N: after a read that lands in a tensor, the daemon
	 * stores up to N KiB more of that tensor in the kernel's page cache
	 * (0: off). */
	unsigned push_ahead_kb;
	/* cache_size=: bytes of backing-file blocks kept for strided gathers
	 * (reshard/bcache.h); 0 disables, FLX_MO_CACHE_AUTO (unset): see
	 * flx_mo_cache_bytes(). */
	uint64_t cache_size;
	/* follow_symlinks[=0|1]: flx_ckpt_opts.follow_symlinks */
	bool follow_symlinks;
	/* nonempty[=0|1]: a MOUNTPOINT with entries is mounted over (it is
	 * refused otherwise; libfuse 3 no longer checks) */
	bool nonempty;
	/* gpu=auto|on|off, gpu_min=SIZE, gpu_device=N: the slicer the mount
	 * opens (gpu/slice.h, flx_slicer_open(); library stays NULL) */
	flx_slicer_opts gpu;
	/* mpi[=0|1]: one daemon of a distributed mount per MPI rank
	 * (fs/mpi_mount.h); mpi_timeout=SECONDS: how long a read waits for
	 * another rank before EIO (0: the default) */
	bool mpi;
	unsigned mpi_timeout;
} flx_mountopts;

/** Defaults (see flx_spec_init), no source, no libfuse tokens.
 * @return 0 or -ENOMEM. */
int flx_mo_init(flx_mountopts *mo);

/** Free everything; safe after a failed or partial init. */
void flx_mo_release(flx_mountopts *mo);

/** The open options mo gives (source_format, follow_symlinks, the
 * plugins' values; borrowed from mo), the rest zero.  Pure. */
flx_ckpt_opts flx_mo_ckpt_opts(const flx_mountopts *mo);

/**
 * Split an option string at commas the way libfuse's fuse_opt does:
 * "\," is a literal comma, "\\" a backslash, "\NNN" an octal byte, "\x"
 * any other character x.  Empty tokens are skipped.
 * @return 0 and *out (owned: flx_mo_tokens_free(*out, *n)), or -ENOMEM.
 */
int flx_mo_split(const char *opts, char ***out, size_t *n);

void flx_mo_tokens_free(char **tok, size_t n);

/** Class of one unescaped token. */
flx_mo_class flx_mo_classify(const char *tok);

/**
 * Apply one unescaped token: ours go to the spec, fstab and rw/ro are
 * dropped, the rest is remembered for flx_mo_fuse_optstring().
 * @return 0, or -errno with err naming the option (bad value, missing
 *         value, rules file that does not load).
 */
int flx_mo_option(flx_mountopts *mo, const char *tok, flx_error *err);

/** flx_mo_split() + flx_mo_option() on each token, stopping at the first
 * error.  @return 0 or -errno with err. */
int flx_mo_options(flx_mountopts *mo, const char *opts, flx_error *err);

/**
 * Bytes of the mount's block cache.  cache_size= when given; unset, enough
 * for the largest chunk the gathers read (span bytes, see
 * flx_ckpt_gather_span()) and two blocks besides (a chunk rarely starts on
 * a block boundary, and readers on two threads each pin one), at least
 * FLX_MO_CACHE_FLOOR, at most FLX_MO_CACHE_AUTO_MAX and phys / 8 (phys:
 * the machine's memory in bytes, 0 if unknown): a transposed tensor reads
 * at full speed without tuning, and never at the cost of the machine.
 */
uint64_t flx_mo_cache_bytes(const flx_mountopts *mo, uint64_t span,
			    uint64_t phys);

/** What a block cache needs to hold a chunk spanning span bytes: its whole
 * 1 MiB blocks and two more (see flx_mo_cache_bytes()); what the mount
 * suggests when a chunk outgrows the cache. */
uint64_t flx_mo_cache_fit(uint64_t span);

/** Record the checkpoint directory (copied).  @return 0 or -ENOMEM. */
int flx_mo_set_source(flx_mountopts *mo, const char *src);

/**
 * Escape s for use inside a libfuse option list: "," -> "\," and
 * "\" -> "\\" (the inverse of flx_mo_split for one token).
 * @return a new string (owned: free()), or NULL on allocation failure.
 */
char *flx_mo_escape(const char *s);

/**
 * The final "-o" value for libfuse: the user's libfuse tokens in order,
 * then ro, default_permissions, subtype=flexfs (unless given) and
 * fsname=<source> (unless given), every token escaped.  allow_other and
 * friends appear only when the user asked for them.
 * @return 0 and *out (owned: free()), -EINVAL without a source, or -ENOMEM.
 */
int flx_mo_fuse_optstring(const flx_mountopts *mo, char **out);

/** True when argv0's basename starts with "mount." (we run as a mount(8)
 * helper: /sbin/mount.flexfs or /sbin/mount.fuse.flexfs). */
bool flx_mo_is_helper(const char *argv0);

/**
 * Rewrite argv for libfuse.  As a mount(8) helper, mount's own flags are
 * dropped: -s (sloppy), -f (fake), -n (no mtab), -v (verbose) and -t TYPE
 * would otherwise mean single-threaded / foreground to libfuse, and a
 * helper must daemonize.  Everything after "--" and the argument of -o
 * are copied untouched.  Outside helper mode argv is copied as is.
 * @return 0 and *out_argv (the array is owned: free(); the strings are
 *         borrowed from argv; NULL-terminated) with *out_argc, or -ENOMEM.
 */
int flx_mo_argv(int argc, char **argv, int *out_argc, char ***out_argv);

/**
 * The "MAJ:MIN" device of the mount at mnt (an absolute, canonical path)
 * in the text of /proc/self/mountinfo, taking the last (topmost) entry
 * whose file-system type starts with "fuse".  Mount points are matched
 * after undoing mountinfo's octal escapes (\040 for a space...).
 * @return 0 and dev (NUL-terminated), -ENOENT if no entry matches, or
 *         -ENAMETOOLONG if dev is too small.
 */
int flx_mo_mountinfo_dev(const char *mountinfo, const char *mnt, char *dev,
			 size_t len);

/**
 * The file-system type ("fuse.flexfs", "ext4") of the topmost mount at mnt
 * (an absolute, canonical path) in the text of /proc/self/mountinfo,
 * escapes undone as for flx_mo_mountinfo_dev().
 * @return 0 and type (NUL-terminated), -ENOENT if nothing is mounted there,
 *         or -ENAMETOOLONG if type is too small.
 */
int flx_mo_mountinfo_type(const char *mountinfo, const char *mnt, char *type,
			  size_t len);

/**
 * The i-th (from 0) group of the options we own: the view's
 * (flx_spec_opt_group), the open's, the mount's, the slicer's, the
 * distributed mount's, then the plugins' (flx_plugin_group()).
 * @return the group (static), or NULL past the last.  Pure.
 */
const flx_opt_group *flx_mo_group(size_t i);

/**
 * The option we own named by the len bytes at name, and its group in
 * *group (may be NULL).  @return the option (static), or NULL.  Pure.
 */
const flx_opt *flx_mo_find(const char *name, size_t len,
			   const flx_opt_group **group);

/**
 * Print the help of every option program prog (FLX_PROG_*) accepts,
 * group by group (flx_opt_print_help()), then what the mount adds and
 * ignores (flx_mo_help_tail).
 */
void flx_mo_print_help(FILE *f, unsigned prog);

/** Print "Checkpoint formats: a, b, ..." (every source's name, as
 * source_format= takes it), wrapped at 79 columns. */
void flx_mo_print_formats(FILE *f);

/* What every mount adds, ignores and hands on (static text). */
extern const char flx_mo_help_tail[];

#endif
