/* SPDX-License-Identifier: MIT */
/*
 * The option tables as the parser and the documentation see them
 * (mountopts.h, optdoc.h): every option of every group has a name of
 * [a-z0-9_], one sentence of help and, unless a flag, a metavar or
 * choices; names are unique across the groups; the parser takes each as
 * ours, bare and with a value, and nothing else; each program's --help
 * names every option it accepts as "-o SYNOPSIS", and names no other.
 */
#include "check.h"
#include "mountopts.h"
#include "opt.h"
#include "optdoc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool name_ok(const char *n)
{
	if (!*n)
		return false;
	for (; *n; n++)
		if (!((*n >= 'a' && *n <= 'z') || (*n >= '0' && *n <= '9') ||
		      *n == '_'))
			return false;
	return true;
}

static void test_tables(void)
{
	const flx_opt_group *g, *g2;
	size_t total = 0;

	for (size_t i = 0; (g = flx_mo_group(i)); i++) {
		CHECK(g->title && *g->title);
		CHECK(g->owner && *g->owner);
		for (size_t k = 0; k < g->nopts; k++) {
			const flx_opt *o = &g->opts[k];
			char tok[128];

			total++;
			CHECK(name_ok(o->name));
			CHECK(o->help && *o->help && !strchr(o->help, '\n'));
			if (!o->help || !*o->help)
				fprintf(stderr, "  %s: no help\n", o->name);
			CHECK(o->type == FLX_OPT_FLAG || o->metavar ||
			      o->choices);
			CHECK(o->type != FLX_OPT_CHOICE || o->choices);
			CHECK_EQ(flx_mo_classify(o->name), FLX_MO_OURS);
			snprintf(tok, sizeof(tok), "%s=1", o->name);
			CHECK_EQ(flx_mo_classify(tok), FLX_MO_OURS);
			CHECK(flx_mo_find(o->name, strlen(o->name), &g2) == o);
			CHECK(g2 == g);
			/* no other group has the name */
			for (size_t j = 0; (g2 = flx_mo_group(j)); j++)
				if (g2 != g)
					CHECK(!flx_opt_group_find(g2, o->name));
		}
	}
	CHECK(total > 30);
	CHECK_EQ(flx_mo_classify("no_such_option"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("allow_other"), FLX_MO_FUSE);
	/* a prefix or extension of a name is not the name */
	CHECK_EQ(flx_mo_classify("t=1"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("tpx=1"), FLX_MO_FUSE);
}

static void test_help(const flx_prog_doc *d)
{
	const flx_opt_group *g;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	size_t named = 0, want = 0;

	CHECK(f != NULL);
	if (!f)
		return;
	flx_doc_usage(f, d, NULL);
	fclose(f);
	for (size_t i = 0; (g = flx_mo_group(i)); i++)
		for (size_t k = 0; k < g->nopts; k++) {
			char syn[128], pat[160];

			if (!flx_opt_for(&g->opts[k], d->prog))
				continue;
			want++;
			snprintf(
			    pat, sizeof(pat), "    -o %s",
			    flx_opt_synopsis(&g->opts[k], syn, sizeof(syn)));
			CHECK(strstr(buf, pat) != NULL);
		}
	/* every "-o name" the help names is one of ours */
	for (char *p = buf; (p = strstr(p, "    -o ")); p += 7) {
		size_t n =
		    strspn(p + 7, "abcdefghijklmnopqrstuvwxyz0123456789_");

		if (!n)
			continue; /* "-o OPTIONS" */
		named++;
		CHECK(flx_mo_find(p + 7, n, NULL) != NULL);
	}
	CHECK_EQ(named, want);
	CHECK(strstr(buf, "Checkpoint formats:") != NULL);
	free(buf);
}

int main(void)
{
	test_tables();
	test_help(&flx_doc_flexfs);
	test_help(&flx_doc_inspect);
	test_help(&flx_doc_materialize);
	return CHECK_RESULT();
}
