/* SPDX-License-Identifier: MIT */
#include "plugins.h"

#include "aoa.h"
#include "formats/compat.h"
#include "layout.h"
#include "source.h"

#include <string.h>

/* The transforms' option groups, NULL-terminated. */
static const flx_opt_group *const flx_transforms[] = {&flx_aoa_opt_group, NULL};

/* The file formats' options (which dtypes their files hold), after the
 * layouts'. */
static const flx_opt_group *const flx_formats[] = {&flx_fmt_opt_group, NULL};

/* Every group in registry order, duplicates included (NULL: none at i);
 * *end set past the last index. */
static const flx_opt_group *nth(size_t i, bool *end)
{
	size_t n = 0;

	*end = false;
	for (size_t k = 0; flx_sources[k]; k++, n++)
		if (n == i)
			return flx_sources[k]->opts;
	for (size_t k = 0; flx_transforms[k]; k++, n++)
		if (n == i)
			return flx_transforms[k];
	for (size_t k = 0; k < flx_nlayouts; k++, n++)
		if (n == i)
			return flx_layouts[k]->opts;
	for (size_t k = 0; flx_formats[k]; k++, n++)
		if (n == i)
			return flx_formats[k];
	*end = true;
	return NULL;
}

const flx_opt_group *flx_plugin_group(size_t i)
{
	const flx_opt_group *g;
	bool end = false;

	for (size_t k = 0; !end; k++) {
		bool seen = false;

		g = nth(k, &end);
		if (!g)
			continue;
		for (size_t j = 0; j < k && !seen; j++) {
			bool e;

			seen = nth(j, &e) == g;
		}
		if (!seen && !i--)
			return g;
	}
	return NULL;
}

const flx_opt *flx_plugin_opt(const char *name, const flx_opt_group **group)
{
	const flx_opt_group *g;

	for (size_t i = 0; (g = flx_plugin_group(i)); i++) {
		const flx_opt *o = flx_opt_group_find(g, name);

		if (o) {
			if (group)
				*group = g;
			return o;
		}
	}
	return NULL;
}
