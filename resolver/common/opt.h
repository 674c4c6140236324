/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_COMMON_OPT_H
#define FLX_RESOLVER_COMMON_OPT_H

/*
 * Options declared once, by whoever owns them.  A plugin (a source, a
 * transform, a layout) or a part of the core declares its "-o NAME=VALUE"
 * options as a table of flx_opt: name, type, metavar, default, one line of
 * help, choices and an optional check().  The tables are grouped by owner
 * (flx_opt_group) and enumerated by one registry (fs/plugins.h); the
 * option parser, every program's --help, the man pages and the README's
 * option table are all made from them.
 *
 * A plugin's values live in a value store (flx_opt_vals): the parser
 * stores each given option there, checked and converted by its type, and
 * the plugin reads it back by name (flx_opt_u64() ...), -ENOENT when the
 * option was not given.  The core never looks inside a plugin's values.
 *
 * Thread-safety: tables are static and immutable; a store is written by
 * one thread while options are parsed, then only read (any thread).
 */

#include "error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum flx_opt_type {
	FLX_OPT_FLAG = 0, /* "name", "name=1|true", "name=0|false" */
	FLX_OPT_UINT,	  /* a decimal number in [min, max] */
	FLX_OPT_SIZE,	  /* bytes, optional K/M/G/T (binary), [min, max] */
	FLX_OPT_TEXT,	  /* any non-empty text */
	FLX_OPT_PATH,	  /* a file's path, stored absolute (the daemon
			   * changes directory after the parse) */
	FLX_OPT_CHOICE,	  /* one of choices */
	FLX_OPT_GLOBS,	  /* globs separated by ':'; each use adds more */
} flx_opt_type;

/* The programs that accept an option (flx_opt.progs). */
#define FLX_PROG_MOUNT	     1u /* flexfs, mount.flexfs */
#define FLX_PROG_INSPECT     2u /* flexfs-inspect */
#define FLX_PROG_MATERIALIZE 4u /* flexfs-materialize */
#define FLX_PROG_ALL	     7u

/* flx_opt.flags */
/* the value may be absent ("-o name"): check() is called with NULL
 * (without it: "needs a value (name=...)" for any type but a flag) */
#define FLX_OPT_BARE 1u
/* read only by the source that owns the option's group: given when
 * another source reads the checkpoint, the open is refused rather than
 * the option ignored without a word */
#define FLX_OPT_OWN 2u

typedef struct flx_opt flx_opt;

/*
 * Extra validation and conversion of a value, in the owner's words: a
 * number's own grammar (into *num), a text's constraints.  value is NULL
 * only with FLX_OPT_BARE.  Replaces the type's own parse of a number
 * (UINT, SIZE: *num is stored) and runs before the store of a text.
 * @return 0, or -EINVAL with err naming the option (its key) and reason.
 */
typedef int (*flx_opt_check_fn)(const flx_opt *o, const char *value,
				uint64_t *num, flx_error *err);

struct flx_opt {
	const char *name; /* "tp", "rules" */
	flx_opt_type type;
	const char *metavar; /* "N", "FILE", "SIZE"; NULL for a flag */
	const char *def;     /* the default, as help shows it; NULL: none */
	/* one sentence of help, no newline (the formatters wrap it) */
	const char *help;
	const char *const *choices; /* FLX_OPT_CHOICE, NULL-terminated */
	uint64_t min, max;	    /* UINT, SIZE (both 0: any) */
	flx_opt_check_fn check;	    /* NULL: the type's parse alone */
	unsigned progs;		    /* FLX_PROG_*; 0 means all */
	unsigned flags;		    /* FLX_OPT_BARE */
};

typedef struct flx_opt_group {
	/* who owns the options: "spec", "mount", or a plugin's name
	 * (a source's format name, a layout's directory) */
	const char *owner;
	const char *title; /* the help section's heading */
	const flx_opt *opts;
	size_t nopts;
	/* the core applies these options itself (the target spec, the
	 * mount's settings): the parser does not put them in a store */
	bool core;
} flx_opt_group;

/* The number of entries of a static array of flx_opt. */
#define FLX_OPT_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* One stored value. */
typedef struct flx_opt_val {
	const flx_opt *opt;
	uint64_t num; /* FLAG (0, 1), UINT, SIZE; CHOICE: its index */
	char *text;   /* TEXT, CHOICE; PATH made absolute (owned) */
	char **list;  /* GLOBS, in order (owned) */
	size_t nlist;
} flx_opt_val;

/* A value store; zero-initialise (or flx_opt_vals_init()). */
typedef struct flx_opt_vals {
	flx_opt_val *v;
	size_t n;
} flx_opt_vals;

/** An empty store. */
void flx_opt_vals_init(flx_opt_vals *vals);

/** Free every value; the store is empty after.  NULL is fine. */
void flx_opt_vals_release(flx_opt_vals *vals);

/**
 * Check value (NULL: "-o name" with no '=') by o's type and check() and
 * store it, replacing an earlier value of o (GLOBS: adding to it).
 * @return 0, -EINVAL with err naming o->name, or -ENOMEM.
 */
int flx_opt_vals_set(flx_opt_vals *vals, const flx_opt *o, const char *value,
		     flx_error *err);

/**
 * Copy src into dst (empty before), for a holder that outlives the
 * parser's.  @return 0 or -ENOMEM (dst empty).
 */
int flx_opt_vals_copy(flx_opt_vals *dst, const flx_opt_vals *src);

/*
 * Reading a store, by option name.  vals may be NULL (nothing given).
 * Each returns 0 and the value when the option was given, -ENOENT when it
 * was not (the owner then applies its default), -EINVAL when it was given
 * but is not of that kind (a programming error).  Strings are borrowed
 * from the store.
 */
bool flx_opt_given(const flx_opt_vals *vals, const char *name);
/* where name's latest value stands among the values given (0, 1, ...:
 * the order of the last use of each option), or -ENOENT; for options
 * whose meanings overlap, where the later one wins */
int flx_opt_order(const flx_opt_vals *vals, const char *name);
int flx_opt_u64(const flx_opt_vals *vals, const char *name, uint64_t *out);
int flx_opt_flag(const flx_opt_vals *vals, const char *name, bool *out);
int flx_opt_text(const flx_opt_vals *vals, const char *name, const char **out);
int flx_opt_list(const flx_opt_vals *vals, const char *name, char *const **out,
		 size_t *n);

/** The option of g named name, or NULL. */
const flx_opt *flx_opt_group_find(const flx_opt_group *g, const char *name);

/** Whether program prog (FLX_PROG_*) accepts o. */
static inline bool flx_opt_for(const flx_opt *o, unsigned prog)
{
	return !o->progs || (o->progs & prog);
}

/**
 * o's synopsis: "name=METAVAR", "name[=0|1]" for a flag,
 * "name=a|b|c" for a choice without metavar.  Into buf (cap bytes,
 * truncated).  @return buf.
 */
const char *flx_opt_synopsis(const flx_opt *o, char *buf, size_t cap);

/**
 * o's help sentence with its default appended ("(default: 1)"), into buf.
 * @return buf.
 */
const char *flx_opt_help_text(const flx_opt *o, char *buf, size_t cap);

/**
 * Print group g's options that prog accepts as help text: a heading line
 * "<title>:" then each option as "    -o SYNOPSIS  HELP", the help wrapped
 * at 79 columns, then an empty line.  Nothing when g has none for prog.
 */
void flx_opt_print_help(FILE *f, const flx_opt_group *g, unsigned prog);

/*
 * The values' grammars shared by the core and the plugins.
 */

/**
 * Parse the value of a flag option: absent (NULL, "-o flag"), "1" or
 * "true" set it, "0" or "false" clear it.  Every flag takes this one
 * grammar.  @return 0 and *out, or -EINVAL with err naming key.
 */
int flx_parse_flag(const char *key, const char *value, bool *out,
		   flx_error *err);

/**
 * The value of a path option made absolute against the working directory
 * (the daemon changes to / when it detaches).  @return 0 and *out (owned
 * by the caller), or -EINVAL (empty), -ENOMEM or getcwd()'s -errno, with
 * err naming key.
 */
int flx_parse_path(const char *key, const char *value, char **out,
		   flx_error *err);

/** Parse a size "5G", "512M", "1048576" (binary suffixes, > 0).
 * @return 0 or -EINVAL. */
int flx_parse_size(const char *text, uint64_t *out);

#endif
