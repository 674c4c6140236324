/* SPDX-License-Identifier: MIT */
#ifndef FLX_MOUNTOPTS_OPTDOC_H
#define FLX_MOUNTOPTS_OPTDOC_H

/*
 * The programs' documentation, made from one source: each program's
 * synopsis, description and own command-line flags (flx_prog_doc), and
 * the "-o" options of the tables (flx_mo_group()).  --help of flexfs,
 * flexfs-inspect and flexfs-materialize, their man pages and the
 * README's option table are all printed from here (the man pages and the
 * table by tools/flexfs-optdoc at build time).
 *
 * Thread-safety: static tables; the printers only write to f.
 */

#include <stddef.h>
#include <stdio.h>

/* A command-line flag of a program (not an -o option). */
typedef struct flx_cli_flag {
	const char *flag; /* "-j, --json", "--svg" */
	const char *arg;  /* its argument ("FILE"), or NULL */
	const char *help; /* one sentence */
} flx_cli_flag;

typedef struct flx_prog_doc {
	const char *name;    /* "flexfs-inspect" */
	unsigned prog;	     /* FLX_PROG_* (opt.h) */
	int section;	     /* of its man page: 8 or 1 */
	const char *summary; /* the man page's NAME line, after the dash */
	/* usage lines without the program's name ("CHECKPOINT [-o ...]"),
	 * NULL-terminated */
	const char *const *synopsis;
	/* paragraphs, each one line (the printers wrap them),
	 * NULL-terminated */
	const char *const *description;
	const flx_cli_flag *flags;
	size_t nflags;
	/* NULL, or more man page sections: pairs of a heading and one
	 * paragraph each, NULL-terminated */
	const char *const *man_more;
} flx_prog_doc;

extern const flx_prog_doc flx_doc_flexfs;
extern const flx_prog_doc flx_doc_inspect;
extern const flx_prog_doc flx_doc_materialize;

/** The program's doc by name ("flexfs", ...), or NULL. */
const flx_prog_doc *flx_doc_find(const char *name);

/**
 * --help: the synopsis (argv0 for the name; NULL: d->name), the
 * description, the program's flags, the checkpoint formats, and the -o
 * options the program accepts, group by group.
 */
void flx_doc_usage(FILE *f, const flx_prog_doc *d, const char *argv0);

/** The man page of d (roff, man(7) macros). */
void flx_doc_man(FILE *f, const flx_prog_doc *d);

/** The README's option table: one Markdown table per group. */
void flx_doc_markdown(FILE *f);

#endif
