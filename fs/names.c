/* SPDX-License-Identifier: MIT */
/*
 * File names from tensor and object names; see names.h.
 */
#include "names.h"

#include <errno.h>
#include <string.h>

int flx_file_name(const char *name, const char *suffix, char *out)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = 0, sl = strlen(suffix);

	if (!strcmp(name, ".") || !strcmp(name, "..")) {
		memcpy(out, "%2E", 3);
		n = 3;
		name++;
	}
	for (; *name; name++) {
		if (n + 3 > FLX_NAME_MAX)
			return -ENAMETOOLONG;
		if (*name == '/' || *name == '%') {
			out[n++] = '%';
			out[n++] = hex[(unsigned char)*name >> 4];
			out[n++] = hex[(unsigned char)*name & 15];
		} else {
			out[n++] = *name;
		}
	}
	if (n + sl > FLX_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(out + n, suffix, sl + 1);
	return 0;
}
