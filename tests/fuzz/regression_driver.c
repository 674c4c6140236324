/* SPDX-License-Identifier: MIT */
/*
 * Runs a fuzz target over every file of the corpus directories given on
 * the command line, without libFuzzer, so the committed corpora (and every
 * crash ever found) replay under plain ctest and the sanitizer build.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf;
	long n;

	if (!f)
		return -1;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET)) {
		fclose(f);
		return -1;
	}
	buf = malloc((size_t)n + 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)n);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	size_t count = 0;

	for (int i = 1; i < argc; i++) {
		DIR *d = opendir(argv[i]);
		struct dirent *de;

		if (!d) {
			fprintf(stderr, "cannot open corpus %s\n", argv[i]);
			return 1;
		}
		while ((de = readdir(d))) {
			char path[4096];
			struct stat st;

			snprintf(path, sizeof(path), "%s/%s", argv[i],
				 de->d_name);
			if (stat(path, &st) || !S_ISREG(st.st_mode))
				continue;
			if (run_file(path)) {
				fprintf(stderr, "cannot read %s\n", path);
				closedir(d);
				return 1;
			}
			count++;
		}
		closedir(d);
	}
	printf("%zu inputs replayed\n", count);
	return count ? 0 : 1;
}
