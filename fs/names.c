/* SPDX-License-Identifier: MIT */
/*
 * File names from tensor and object names; see names.h.
 */
#include "names.h"

#include "error.h"

#include <errno.h>
#include <string.h>

int flx_file_name(const char *name, const char *suffix, char *out)
{
	size_t n = 0, sl = strlen(suffix);

	if (!strcmp(name, ".") || !strcmp(name, "..")) {
		memcpy(out, "%2E", 3);
		n = 3;
		name++;
	}
	if (flx_escape(name, true, out + n, FLX_NAME_MAX + 1 - n))
		return -ENAMETOOLONG;
	n += strlen(out + n);
	if (n + sl > FLX_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(out + n, suffix, sl + 1);
	return 0;
}

int flx_extra_name(const char *name, char *out)
{
	size_t n;

	for (const char *p = name; *p; p += n)
		if (flx_escape_at(p, &n))
			return flx_file_name(name, "", out);
	if (strlen(name) > FLX_NAME_MAX)
		return -ENAMETOOLONG;
	strcpy(out, name);
	return 0;
}
