/* SPDX-License-Identifier: MIT */
/*
 * flx_default_layer_match() against glibc's regexec() of
 * FLX_DEFAULT_LAYER_REGEX: every name of up to six tokens built from the
 * pieces the regex cares about, and a few hundred thousand random ones.
 * The plan uses the hand matcher for the default regex, so any
 * disagreement here would place a tensor on another stage.
 *
 * And the rules keys "groups" and "when" (flx_spec_rules_parse()): the
 * values accepted, each refusal as one error naming the rule and the key;
 * and the megatron-gpt preset's SwiGLU rules for the MoE experts' fc1
 * under each of their names.
 */
#include "check.h"
#include "spec.h"

#include <errno.h>
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

/* rules text r parses (0) or is refused with -EINVAL and one line whose
 * key is "rule 0: <key>" and whose reason contains why. */
static void rules(const char *r, const char *key, const char *why)
{
	flx_spec s;
	flx_error err;
	int rc;

	flx_spec_init(&s);
	flx_error_init(&err);
	rc = flx_spec_rules_parse(&s, r, strlen(r), "r.json", &err);
	if (!key) {
		CHECK_EQ(rc, 0);
		CHECK_EQ(s.nrules, 1);
	} else {
		char want[64];

		snprintf(want, sizeof(want), "rule 0: %s", key);
		CHECK_EQ(rc, -EINVAL);
		CHECK_STR(err.file, "r.json");
		CHECK_STR(err.key, want);
		CHECK(strstr(err.text, why) != NULL);
		CHECK(!strchr(err.text, '\n') && !strchr(err.key, '\n'));
		if (rc != -EINVAL || !strstr(err.text, why))
			fprintf(stderr, "  rules %s: %d '%s: %s'\n", r, rc,
				err.key, err.text);
	}
	flx_spec_release(&s);
}

/* The bit of fact f in s's "when" sets (flx_spec.facts); 0: not named. */
static unsigned fact_bit(const flx_spec *s, const char *f)
{
	for (size_t i = 0; i < s->nfacts; i++)
		if (!strcmp(s->facts[i], f))
			return 1u << i;
	return 0;
}

static void test_groups_when(void)
{
	static const char *const bad_groups[] = {
	    "0", "-1", "1", "65", "2.0", "\"2\"", "null", "true"};
	static const char *const bad_when[] = {
	    "\"gelu\"", "\"SWIGLU\"", "\"\"", "1", "null", "[\"swiglu\"]"};
	static const char ok[] = "[{\"match\": \"a.*\", \"when\": \"swiglu\", "
				 "\"split\": 1, \"groups\": 2}]";
	char r[160];
	flx_spec s;

	flx_spec_init(&s);
	CHECK_EQ(flx_spec_rules_parse(&s, ok, sizeof(ok) - 1, "r", NULL), 0);
	if (s.nrules == 1) {
		CHECK_EQ(s.rules[0].groups, 2);
		CHECK(fact_bit(&s, "swiglu") != 0);
		CHECK_EQ(s.rules[0].when, fact_bit(&s, "swiglu"));
		CHECK_EQ(s.rules[0].split, FLX_SPLIT_AXIS);
		CHECK_EQ(s.rules[0].axis, 1);
		/* a rule with a fact matches only a source that has it */
		CHECK(flx_spec_match(&s, "a.w") == NULL);
		CHECK(flx_spec_match_facts(&s, "a.w", fact_bit(&s, "swiglu")) ==
		      &s.rules[0]);
	}
	flx_spec_release(&s);
	rules("[{\"match\": \"a\", \"split\": 0, \"groups\": 64}]", NULL, NULL);
	rules("[{\"match\": \"a\", \"groups\": 3, \"split\": 2}]", NULL, NULL);
	for (size_t i = 0; i < sizeof(bad_groups) / sizeof(*bad_groups); i++) {
		snprintf(r, sizeof(r),
			 "[{\"match\": \"a\", \"split\": 0, \"groups\": %s}]",
			 bad_groups[i]);
		rules(r, "groups", "expected a number of parts (2-64)");
	}
	/* groups cut an axis: none named, or none to cut */
	rules("[{\"match\": \"a\", \"groups\": 2}]", "groups",
	      "needs a split axis");
	rules("[{\"match\": \"a\", \"split\": null, \"groups\": 2}]", "groups",
	      "needs a split axis");
	for (size_t i = 0; i < sizeof(bad_when) / sizeof(*bad_when); i++) {
		snprintf(r, sizeof(r),
			 "[{\"match\": \"a\", \"split\": 0, \"when\": %s}]",
			 bad_when[i]);
		rules(r, "when", "expected a model fact (\"swiglu\")");
	}
}

/* The megatron-gpt preset: each name of a MoE expert's fc1 (torch_dist's
 * stacked [layer, expert, rows, in], SequentialMLP's local_experts.E,
 * TEGroupedMLP's weightE) takes the rows axis in 2 groups when the source
 * is SwiGLU, and no grouped rule otherwise; fc2 is never grouped. */
static void test_preset_experts(void)
{
	static const struct {
		const char *fqn;
		int axis; /* -1: no rule; else the rule's axis, in 2 groups */
	} names[] = {
	    {"decoder.layers.mlp.experts.experts.linear_fc1.weight", 2},
	    {"decoder.layers.mlp.experts.experts.linear_fc1.bias", 2},
	    {"decoder.layers.3.mlp.experts.local_experts.7.linear_fc1.weight",
	     0},
	    {"decoder.layers.3.mlp.experts.local_experts.7.linear_fc1.bias", 0},
	    {"decoder.layers.0.mlp.experts.linear_fc1.weight0", 0},
	    {"decoder.layers.0.mlp.experts.linear_fc1.weight12", 0},
	    {"decoder.layers.0.mlp.experts.linear_fc1.bias3", 0},
	};
	static const char *const plain[] = {
	    "decoder.layers.mlp.experts.experts.linear_fc2.weight",
	    "decoder.layers.3.mlp.experts.local_experts.7.linear_fc2.weight",
	    "decoder.layers.0.mlp.experts.linear_fc2.weight1",
	};
	unsigned char *text;
	size_t len = 0;
	flx_spec s;

	flx_spec_init(&s);
	/* check_read_file reads below unit/data/ */
	text =
	    check_read_file("../../../reshard/presets/megatron-gpt.json", &len);
	CHECK(text != NULL);
	if (!text)
		return;
	CHECK_EQ(flx_spec_rules_parse(&s, (const char *)text, len,
				      "megatron-gpt.json", NULL),
		 0);
	for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++) {
		const flx_rule *g = flx_spec_match_facts(
		    &s, names[i].fqn, fact_bit(&s, "swiglu"));
		const flx_rule *u = flx_spec_match(&s, names[i].fqn);

		CHECK(g && g->groups == 2 && g->split == FLX_SPLIT_AXIS &&
		      g->axis == names[i].axis);
		CHECK(!u || u->groups == 0);
		if (!g || g->groups != 2 || g->axis != names[i].axis)
			fprintf(stderr, "  %s: rule %s\n", names[i].fqn,
				g ? g->match : "(none)");
	}
	for (size_t i = 0; i < sizeof(plain) / sizeof(*plain); i++) {
		const flx_rule *g =
		    flx_spec_match_facts(&s, plain[i], fact_bit(&s, "swiglu"));

		CHECK(!g || g->groups == 0);
	}
	free(text);
	flx_spec_release(&s);
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
	test_groups_when();
	test_preset_experts();
	printf("%zu names compared, %zu matched\n", compared, matched);
	CHECK(matched > 1000 && compared - matched > 1000);
	return CHECK_RESULT();
}
