/* SPDX-License-Identifier: MIT */
/*
 * flexfs-optdoc: print the documentation the option tables make
 * (mountopts/optdoc.h), at build time:
 *   flexfs-optdoc man PROGRAM      the man page of flexfs,
 *                                  flexfs-inspect or flexfs-materialize
 *   flexfs-optdoc markdown         the README's option table
 *   flexfs-optdoc names PROGRAM    the -o options PROGRAM accepts, one a
 *                                  line (tests compare them with --help
 *                                  and the man page); "all": every
 *                                  program's
 *   flexfs-optdoc help PROGRAM     PROGRAM's --help text (without
 *                                  libfuse's part)
 */
#include "mountopts.h"
#include "opt.h"
#include "optdoc.h"

#include <stdio.h>
#include <string.h>

/* The names of the options prog accepts (0: every program's). */
static int names(unsigned prog)
{
	const flx_opt_group *g;

	for (size_t i = 0; (g = flx_mo_group(i)); i++)
		for (size_t k = 0; k < g->nopts; k++)
			if (!prog || flx_opt_for(&g->opts[k], prog))
				printf("%s\n", g->opts[k].name);
	return 0;
}

int main(int argc, char **argv)
{
	const flx_prog_doc *d = argc == 3 ? flx_doc_find(argv[2]) : NULL;

	if (argc == 2 && !strcmp(argv[1], "markdown")) {
		flx_doc_markdown(stdout);
		return 0;
	}
	if (d && !strcmp(argv[1], "man")) {
		flx_doc_man(stdout, d);
		return 0;
	}
	if (d && !strcmp(argv[1], "names"))
		return names(d->prog);
	if (argc == 3 && !strcmp(argv[1], "names") && !strcmp(argv[2], "all"))
		return names(0);
	if (d && !strcmp(argv[1], "help")) {
		flx_doc_usage(stdout, d, NULL);
		return 0;
	}
	fprintf(stderr, "usage: %s man|names|help PROGRAM, or %s markdown\n",
		argv[0], argv[0]);
	return 2;
}
