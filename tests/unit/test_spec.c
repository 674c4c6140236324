/* SPDX-License-Identifier: MIT */
/*
 * flx_default_layer_match() against glibc's regexec() of
 * FLX_DEFAULT_LAYER_REGEX: every name of up to six tokens built from the
 * pieces the regex cares about, and a few hundred thousand random ones.
 * The plan uses the hand matcher for the default regex, so any
 * disagreement here would place a tensor on another stage.
 */
#include "check.h"
#include "spec.h"

#include <regex.h>

static const char *const tokens[] = {"layers", "layer", "s", ".",
				     "0",      "12",	"x", "layers."};
#define NTOK (sizeof(tokens) / sizeof(tokens[0]))

static regex_t rx;
static size_t compared, matched;

static void compare(const char *name)
{
	regmatch_t g[3];
	size_t so = 0, eo = 0;
	bool want = regexec(&rx, name, 3, g, 0) == 0;
	bool got = flx_default_layer_match(name, &so, &eo);

	compared++;
	if (want != got) {
		fprintf(stderr, "'%s': regexec %d, hand matcher %d\n", name,
			want, got);
		check_failures++;
		return;
	}
	if (!want)
		return;
	matched++;
	if ((size_t)g[2].rm_so != so || (size_t)g[2].rm_eo != eo) {
		fprintf(stderr,
			"'%s': regexec [%d,%d), hand matcher [%zu,%zu)\n", name,
			(int)g[2].rm_so, (int)g[2].rm_eo, so, eo);
		check_failures++;
	}
}

static void all_names(char *buf, size_t len, int depth)
{
	compare(buf);
	if (depth == 0)
		return;
	for (size_t t = 0; t < NTOK; t++) {
		size_t n = strlen(tokens[t]);

		memcpy(buf + len, tokens[t], n + 1);
		all_names(buf, len + n, depth - 1);
		buf[len] = 0;
	}
}

int main(void)
{
	static const char alphabet[] = "layers.0123x";
	char buf[128] = "";
	unsigned seed = 12345;

	CHECK(regcomp(&rx, FLX_DEFAULT_LAYER_REGEX, REG_EXTENDED) == 0);
	all_names(buf, 0, 6);
	/* random strings over the regex's own characters */
	for (int i = 0; i < 300000; i++) {
		int n = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 24;

		for (int k = 0; k < n; k++) {
			seed = seed * 1103515245u + 12345u;
			buf[k] =
			    alphabet[(seed >> 16) % (sizeof(alphabet) - 1)];
		}
		buf[n] = 0;
		compare(buf);
	}
	/* real names */
	compare("model.layers.31.self_attn.q_proj.weight");
	compare("layers.0.attention.wq.weight");
	compare("decoder.layers.7");
	compare("xlayers.3.w");
	regfree(&rx);
	printf("%zu names compared, %zu matched\n", compared, matched);
	CHECK(matched > 1000 && compared - matched > 1000);
	return CHECK_RESULT();
}
