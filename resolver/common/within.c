/* SPDX-License-Identifier: MIT */
#include "within.h"

#include <limits.h>
#include <string.h>
#include <sys/stat.h>

bool flx_path_within_dir(const char *dir, const char *path)
{
	char p[PATH_MAX];
	struct stat d, s;
	size_t n = strlen(path);

	if (stat(dir, &d) || !S_ISDIR(d.st_mode) || n == 0 || n >= sizeof(p))
		return false;
	memcpy(p, path, n + 1);
	for (;;) {
		if (!stat(p, &s) && s.st_dev == d.st_dev &&
		    s.st_ino == d.st_ino)
			return true;
		if (n <= 1)
			return false; /* "/" was the last */
		while (n > 1 && p[n - 1] != '/')
			n--; /* drop the last component */
		if (n > 1)
			n--; /* and its slash, but keep "/" */
		p[n] = '\0';
	}
}
