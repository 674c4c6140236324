/* SPDX-License-Identifier: MIT */
/* Megatron's TP split rules; see mlg_rules.h. */
#include "mlg_rules.h"

#include <string.h>

static bool ends_with(const char *s, const char *suf)
{
	size_t n = strlen(s), k = strlen(suf);

	return n >= k && !strcmp(s + n - k, suf);
}

flx_mlg_split flx_mlg_split_rule(const char *mod, const char *prm, bool swiglu)
{
	const char *d = strrchr(mod, '.'), *m = d ? d + 1 : mod;
	bool w = !strcmp(prm, "weight"), b = !strcmp(prm, "bias");

	if ((!strcmp(mod, "embedding.word_embeddings") && w) ||
	    (!strcmp(mod, "output_layer") && (w || b)))
		return FLX_MLG_VOCAB;
	if (!strncmp(prm, "layer_norm_", 11) || ends_with(m, "layernorm") ||
	    !strcmp(m, "router") ||
	    !strcmp(mod, "embedding.position_embeddings"))
		return FLX_MLG_REPL;
	if (!strcmp(m, "linear_qkv") && (w || b))
		return FLX_MLG_COL;
	if (!strcmp(m, "linear_fc1") && (w || b))
		return swiglu ? FLX_MLG_GLU : FLX_MLG_COL;
	if ((!strcmp(m, "linear_proj") || !strcmp(m, "linear_fc2")) && w)
		return FLX_MLG_ROW;
	if ((!strcmp(m, "linear_proj") || !strcmp(m, "linear_fc2")) && b)
		return FLX_MLG_REPL;
	if (!strcmp(m, "core_attention") && !strcmp(prm, "softmax_offset"))
		return FLX_MLG_COL;
	return FLX_MLG_CHUNKS;
}
