/* SPDX-License-Identifier: MIT */
/*
 * Option tables and value stores (resolver/common/opt.h): each type's
 * grammar and bounds, check() hooks, bare options, lists that grow,
 * replacement order, copies, the typed accessors' -ENOENT, and the help a
 * table prints.  The expectations are written here from opt.h's contract,
 * not taken from the code's output.
 */
#include "check.h"
#include "opt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const colours[] = {"red", "green", "blue", NULL};

/* Accepts only even numbers, in its own words. */
static int check_even(const flx_opt *o, const char *value, uint64_t *num,
		      flx_error *err)
{
	char *end;
	unsigned long long v = value ? strtoull(value, &end, 10) : 1;

	if (!value || !*value || *end || v % 2)
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "'%s' is not even", value ? value : "");
	*num = v;
	return 0;
}

static const flx_opt opts[] = {
    {.name = "flag", .type = FLX_OPT_FLAG, .help = "a flag"},
    {.name = "count",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "3",
     .help = "a count",
     .min = 1,
     .max = 10},
    {.name = "bytes", .type = FLX_OPT_SIZE, .metavar = "SIZE", .help = "b"},
    {.name = "word", .type = FLX_OPT_TEXT, .metavar = "W", .help = "a word"},
    {.name = "file", .type = FLX_OPT_PATH, .metavar = "FILE", .help = "f"},
    {.name = "colour",
     .type = FLX_OPT_CHOICE,
     .help = "a colour",
     .choices = colours},
    {.name = "glob", .type = FLX_OPT_GLOBS, .metavar = "G", .help = "g"},
    {.name = "even",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .help = "an even number",
     .check = check_even,
     .flags = FLX_OPT_BARE},
    {.name = "only_inspect",
     .type = FLX_OPT_FLAG,
     .help = "inspect's",
     .progs = FLX_PROG_INSPECT},
};

static const flx_opt_group group = {
    .owner = "test",
    .title = "Test options",
    .opts = opts,
    .nopts = FLX_OPT_COUNT(opts),
};

static const flx_opt *opt(const char *name)
{
	const flx_opt *o = flx_opt_group_find(&group, name);

	CHECK(o != NULL);
	return o;
}

/* value is refused for name, with err naming name and containing why. */
static void bad(const char *name, const char *value, const char *why)
{
	flx_opt_vals v = {0};
	flx_error e;

	flx_error_init(&e);
	CHECK_EQ(flx_opt_vals_set(&v, opt(name), value, &e), -EINVAL);
	CHECK_STR(e.key, name);
	CHECK(strstr(e.text, why) != NULL);
	if (!strstr(e.text, why))
		fprintf(stderr, "  %s=%s: '%s'\n", name,
			value ? value : "(none)", e.text);
	CHECK(!flx_opt_given(&v, name));
	flx_opt_vals_release(&v);
}

static void test_types(void)
{
	flx_opt_vals v = {0};
	uint64_t n = 0;
	bool f = false;
	const char *t = NULL;
	char *const *l = NULL;
	size_t nl = 0;
	char cwd[4096], want[4200];

	CHECK_EQ(flx_opt_u64(&v, "count", &n), -ENOENT);
	CHECK_EQ(flx_opt_flag(NULL, "flag", &f), -ENOENT);
	CHECK_EQ(flx_opt_vals_set(&v, opt("flag"), NULL, NULL), 0);
	CHECK_EQ(flx_opt_flag(&v, "flag", &f), 0);
	CHECK(f);
	CHECK_EQ(flx_opt_vals_set(&v, opt("flag"), "false", NULL), 0);
	CHECK_EQ(flx_opt_flag(&v, "flag", &f), 0);
	CHECK(!f);
	bad("flag", "yes", "expected 0/1/true/false");

	CHECK_EQ(flx_opt_vals_set(&v, opt("count"), "10", NULL), 0);
	CHECK_EQ(flx_opt_u64(&v, "count", &n), 0);
	CHECK_EQ(n, 10);
	bad("count", "11", "from 1 to 10");
	bad("count", "0", "from 1 to 10");
	bad("count", "-1", "got '-1'");
	bad("count", "3x", "got '3x'");
	bad("count", "", "got ''");
	bad("count", NULL, "needs a value (count=...)");
	/* a number read as a flag is a programming error, not absence */
	CHECK_EQ(flx_opt_flag(&v, "count", &f), -EINVAL);

	CHECK_EQ(flx_opt_vals_set(&v, opt("bytes"), "2M", NULL), 0);
	CHECK_EQ(flx_opt_u64(&v, "bytes", &n), 0);
	CHECK_EQ(n, 2u << 20);
	CHECK_EQ(flx_opt_vals_set(&v, opt("bytes"), "0", NULL), 0);
	CHECK_EQ(flx_opt_u64(&v, "bytes", &n), 0);
	CHECK_EQ(n, 0);
	bad("bytes", "lots", "got 'lots'");

	CHECK_EQ(flx_opt_vals_set(&v, opt("word"), "hello", NULL), 0);
	CHECK_EQ(flx_opt_text(&v, "word", &t), 0);
	CHECK_STR(t, "hello");
	bad("word", "", "needs a value");

	CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
	snprintf(want, sizeof(want), "%s/rel/x.json", cwd);
	CHECK_EQ(flx_opt_vals_set(&v, opt("file"), "rel/x.json", NULL), 0);
	CHECK_EQ(flx_opt_text(&v, "file", &t), 0);
	CHECK_STR(t, want);
	CHECK_EQ(flx_opt_vals_set(&v, opt("file"), "/abs", NULL), 0);
	CHECK_EQ(flx_opt_text(&v, "file", &t), 0);
	CHECK_STR(t, "/abs");
	bad("file", "", "needs a path (file=...)");

	CHECK_EQ(flx_opt_vals_set(&v, opt("colour"), "blue", NULL), 0);
	CHECK_EQ(flx_opt_u64(&v, "colour", &n), 0);
	CHECK_EQ(n, 2);
	CHECK_EQ(flx_opt_text(&v, "colour", &t), 0);
	CHECK_STR(t, "blue");
	bad("colour", "pink", "expected red, green or blue, got 'pink'");

	CHECK_EQ(flx_opt_vals_set(&v, opt("glob"), "a*:b*", NULL), 0);
	CHECK_EQ(flx_opt_vals_set(&v, opt("glob"), "c", NULL), 0);
	/* a bad later use keeps what was stored */
	CHECK_EQ(flx_opt_vals_set(&v, opt("glob"), "d::e", NULL), -EINVAL);
	CHECK_EQ(flx_opt_list(&v, "glob", &l, &nl), 0);
	CHECK_EQ(nl, 3);
	if (nl == 3) {
		CHECK_STR(l[0], "a*");
		CHECK_STR(l[1], "b*");
		CHECK_STR(l[2], "c");
	}
	bad("glob", "", "expected globs separated by ':'");
	bad("glob", "x:", "an empty glob in 'x:'");

	flx_opt_vals_release(&v);
	CHECK_EQ(v.n, 0);
	CHECK(!flx_opt_given(&v, "word"));
}

static void test_check_bare(void)
{
	flx_opt_vals v = {0};
	uint64_t n = 0;

	CHECK_EQ(flx_opt_vals_set(&v, opt("even"), "12", NULL), 0);
	CHECK_EQ(flx_opt_u64(&v, "even", &n), 0);
	CHECK_EQ(n, 12);
	/* check() replaces the type's parse, and says why in its words */
	bad("even", "7", "'7' is not even");
	/* FLX_OPT_BARE: the absent value reaches check() */
	bad("even", NULL, "'' is not even");
	flx_opt_vals_release(&v);
}

static void test_order_copy(void)
{
	flx_opt_vals v = {0}, c = {0};
	const char *t = NULL;
	uint64_t n = 0;

	CHECK_EQ(flx_opt_order(&v, "word"), -ENOENT);
	CHECK_EQ(flx_opt_vals_set(&v, opt("word"), "one", NULL), 0);
	CHECK_EQ(flx_opt_vals_set(&v, opt("count"), "2", NULL), 0);
	CHECK(flx_opt_order(&v, "word") < flx_opt_order(&v, "count"));
	/* a value given again is the latest */
	CHECK_EQ(flx_opt_vals_set(&v, opt("word"), "two", NULL), 0);
	CHECK(flx_opt_order(&v, "word") > flx_opt_order(&v, "count"));
	CHECK_EQ(v.n, 2);
	CHECK_EQ(flx_opt_vals_copy(&c, &v), 0);
	flx_opt_vals_release(&v);
	CHECK_EQ(flx_opt_text(&c, "word", &t), 0);
	CHECK_STR(t, "two");
	CHECK_EQ(flx_opt_u64(&c, "count", &n), 0);
	CHECK_EQ(n, 2);
	flx_opt_vals_release(&c);
}

static void test_help(void)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	char syn[64];

	CHECK(f != NULL);
	if (!f)
		return;
	flx_opt_print_help(f, &group, FLX_PROG_MOUNT);
	fclose(f);
	CHECK(strstr(buf, "Test options:\n") == buf);
	CHECK(strstr(buf, "-o flag[=0|1]") != NULL);
	CHECK(strstr(buf, "-o count=N") != NULL);
	CHECK(strstr(buf, "a count (default: 3)") != NULL);
	CHECK(strstr(buf, "-o colour=red|green|blue") != NULL);
	CHECK(strstr(buf, "-o glob=G[:...]") != NULL);
	/* another program's option is not in this one's help */
	CHECK(strstr(buf, "only_inspect") == NULL);
	for (char *p = buf; *p;
	     p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0))
		CHECK(strcspn(p, "\n") <= 79);
	free(buf);
	CHECK_STR(flx_opt_synopsis(opt("even"), syn, sizeof(syn)), "even=N");
	CHECK(flx_opt_for(opt("only_inspect"), FLX_PROG_INSPECT));
	CHECK(!flx_opt_for(opt("only_inspect"), FLX_PROG_MATERIALIZE));
	CHECK(flx_opt_for(opt("flag"), FLX_PROG_MATERIALIZE));
}

int main(void)
{
	test_types();
	test_check_bare();
	test_order_copy();
	test_help();
	return CHECK_RESULT();
}
