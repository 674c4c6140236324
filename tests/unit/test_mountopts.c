/* SPDX-License-Identifier: MIT */
/* Unit tests for the mount-option layer: tokenizing, classification,
 * application to the spec, helper argv rewriting, the libfuse list. */
#include "check.h"
#include "mountopts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void check_split(const char *in, size_t n, const char *const *want)
{
	char **tok = NULL;
	size_t got = 99;

	CHECK_EQ(flx_mo_split(in, &tok, &got), 0);
	CHECK_EQ(got, n);
	for (size_t i = 0; i < n && i < got; i++)
		CHECK_STR(tok[i], want[i]);
	flx_mo_tokens_free(tok, got);
}

static void test_split(void)
{
	static const char *const plain[] = {"tp=4", "pp=2", "allow_other"};
	static const char *const esc[] = {"fsname=a,b", "x\\y", "s p", "q"};
	static const char *const tail[] = {"a\\"};

	check_split("tp=4,pp=2,allow_other", 3, plain);
	check_split(",tp=4,,pp=2,allow_other,", 3, plain);
	/* \, comma, \\ backslash, \040 octal space, \q any char */
	check_split("fsname=a\\,b,x\\\\y,s\\040p,\\q", 4, esc);
	check_split("a\\", 1, tail); /* a lone trailing backslash stays */
	check_split("", 0, NULL);
}

static void test_classify(void)
{
	CHECK_EQ(flx_mo_classify("tp=4"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("pp=2"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("rules=/r.json"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("layer_regex=x"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("embed_regex=x"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("pp_renumber"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("direct_io"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("direct_io=1"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("passthrough"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("passthrough=0"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("hf_shard_size=1G"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_classify("tp"), FLX_MO_OURS);
	for (const char *const *f =
		 (const char *const[]){
		     "auto", "noauto", "user", "nouser", "users", "_netdev",
		     "nofail", "defaults", "x-systemd.automount", "x-gvfs-show",
		     "comment=systemd.automount", "user=joe", NULL};
	     *f; f++)
		CHECK_EQ(flx_mo_classify(*f), FLX_MO_FSTAB);
	CHECK_EQ(flx_mo_classify("rw"), FLX_MO_RWRO);
	CHECK_EQ(flx_mo_classify("ro"), FLX_MO_RWRO);
	/* Look-alikes are not ours: libfuse reports them as unknown. */
	CHECK_EQ(flx_mo_classify("tpp=4"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("tp_size=4"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("flexfs_tp=4"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("automount"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("allow_other"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("max_read=131072"), FLX_MO_FUSE);
	CHECK_EQ(flx_mo_classify("nosuid"), FLX_MO_FUSE);
}

/* Apply tok to fresh options; expect rc and an error naming key. */
/* A plugin option's stored number (UINT64_MAX: not given). */
static uint64_t opt_u64(const flx_mountopts *mo, const char *name)
{
	uint64_t v = UINT64_MAX;

	flx_opt_u64(&mo->spec.opts, name, &v);
	return v;
}

static void check_bad(const char *tok, const char *key)
{
	flx_mountopts mo;
	flx_error err;
	int rc;

	CHECK_EQ(flx_mo_init(&mo), 0);
	flx_error_init(&err);
	rc = flx_mo_option(&mo, tok, &err);
	if (rc == 0 || err.code != rc || strcmp(err.key, key) != 0)
		fprintf(stderr, "  for '%s': rc %d key '%s' text '%s'\n", tok,
			rc, err.key, err.text);
	CHECK(rc < 0);
	CHECK_EQ(err.code, rc);
	CHECK_STR(err.key, key);
	CHECK(err.text[0] != '\0');
	CHECK_EQ(mo.nfuse, 0);
	flx_mo_release(&mo);
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

static void test_values(void)
{
	char dir[] = "/tmp/flx_mo_XXXXXX", good[64], bad[64], typo[64];
	flx_mountopts mo;
	flx_error err;

	check_bad("tp=0", "tp");
	check_bad("tp=abc", "tp");
	check_bad("tp=", "tp");
	check_bad("tp", "tp");
	check_bad("tp=4x", "tp");
	check_bad("pp=-1", "pp");
	check_bad("rules=/nonexistent/rules.json", "rules");
	check_bad("rules=", "rules");
	check_bad("layer_regex=(", "layer_regex");
	check_bad("hf_shard_size=lots", "hf_shard_size");
	check_bad("pp_renumber=maybe", "pp_renumber");
	check_bad("direct_io=yes", "direct_io");
	check_bad("direct_io=", "direct_io");
	check_bad("direct_io=10", "direct_io");
	check_bad("passthrough=yes", "passthrough");
	check_bad("passthrough=", "passthrough");
	check_bad("read_ahead_kb=-1", "read_ahead_kb");
	check_bad("read_ahead_kb=4k", "read_ahead_kb");
	check_bad("read_ahead_kb=", "read_ahead_kb");
	check_bad("read_ahead_kb", "read_ahead_kb");
	check_bad("read_ahead_kb=1048577", "read_ahead_kb");
	check_bad("read_ahead_kb=99999999999999999999999", "read_ahead_kb");
	check_bad("push_ahead_kb=4k", "push_ahead_kb");
	check_bad("push_ahead_kb=", "push_ahead_kb");
	check_bad("push_ahead_kb=1048577", "push_ahead_kb");
	check_bad("cache_size=", "cache_size");
	check_bad("cache_size", "cache_size");
	check_bad("cache_size=lots", "cache_size");
	check_bad("cache_size=-1", "cache_size");
	check_bad("cache_size=4K", "cache_size"); /* under one block */
	check_bad("cache_size=2T", "cache_size"); /* over 1 TiB */
	check_bad("cache_size=64Q", "cache_size");
	check_bad("gpu", "gpu");
	check_bad("gpu=yes", "gpu");
	check_bad("gpu=ON", "gpu");
	check_bad("gpu_min", "gpu_min");
	check_bad("gpu_min=big", "gpu_min");
	check_bad("gpu_min=-1", "gpu_min");
	check_bad("gpu_cache=lots", "gpu_cache");
	check_bad("gpu_device", "gpu_device");
	check_bad("gpu_device=", "gpu_device");
	check_bad("gpu_device=-1", "gpu_device");
	check_bad("gpu_device=1024", "gpu_device");
	check_bad("gpu_device=99999999999999999999", "gpu_device");
	check_bad("gpu_device=0x1", "gpu_device");
	check_bad("source_format=", "source_format");
	check_bad("source_format", "source_format");
	check_bad("source_format=paddle", "source_format");
	check_bad("source_format=TORCH-DCP", "source_format");

	CHECK(mkdtemp(dir) != NULL);
	snprintf(good, sizeof(good), "%s/good.json", dir);
	snprintf(bad, sizeof(bad), "%s/bad.json", dir);
	snprintf(typo, sizeof(typo), "%s/typo.json", dir);
	CHECK_EQ(write_file(good, "[{\"match\": \"block.*\", \"split\": 0}]"),
		 0);
	CHECK_EQ(write_file(bad, "[{\"match\": "), 0);
	CHECK_EQ(write_file(typo, "[{\"match\": \"a\", \"splitt\": 0}]"), 0);

	CHECK_EQ(flx_mo_init(&mo), 0);
	flx_error_init(&err);
	CHECK_EQ(flx_mo_option(&mo, "tp=4", &err), 0);
	CHECK_EQ(flx_mo_option(&mo, "pp=2", &err), 0);
	CHECK_EQ(flx_mo_option(&mo, "pp_renumber", &err), 0);
	CHECK_EQ(flx_mo_option(&mo, "hf_shard_size=2M", &err), 0);
	{
		char tok[96];

		snprintf(tok, sizeof(tok), "rules=%s", good);
		CHECK_EQ(flx_mo_option(&mo, tok, &err), 0);
		snprintf(tok, sizeof(tok), "rules=%s", bad);
		CHECK(flx_mo_option(&mo, tok, &err) < 0);
		CHECK_STR(err.file, bad);
		flx_error_init(&err);
		snprintf(tok, sizeof(tok), "rules=%s", typo);
		CHECK(flx_mo_option(&mo, tok, &err) < 0);
		CHECK(strstr(err.key, "splitt") != NULL);
	}
	CHECK_EQ(mo.spec.tp, 4);
	CHECK_EQ(mo.spec.pp, 2);
	CHECK(mo.spec.pp_renumber);
	CHECK_EQ(mo.spec.hf_shard_size, 2u << 20);
	CHECK_EQ(mo.spec.nrules, 1); /* the failed loads kept the good one */
	CHECK_EQ(mo.nfuse, 0);
	CHECK_EQ(mo.read_ahead_kb, FLX_MO_READ_AHEAD_AUTO);
	CHECK(!mo.ra_given);
	CHECK_EQ(flx_mo_option(&mo, "read_ahead_kb=0", &err), 0);
	CHECK_EQ(mo.read_ahead_kb, 0);
	CHECK_EQ(flx_mo_option(&mo, "read_ahead_kb=1048576", &err), 0);
	CHECK_EQ(mo.read_ahead_kb, 1048576);
	CHECK(mo.ra_given);
	CHECK_EQ(mo.push_ahead_kb, FLX_MO_PUSH_AHEAD_KB_DEFAULT);
	CHECK_EQ(flx_mo_option(&mo, "push_ahead_kb=8192", &err), 0);
	CHECK_EQ(mo.push_ahead_kb, 8192);
	CHECK(!mo.direct_io);
	CHECK_EQ(flx_mo_option(&mo, "direct_io", &err), 0);
	CHECK(mo.direct_io);
	CHECK_EQ(flx_mo_option(&mo, "direct_io=0", &err), 0);
	CHECK(!mo.direct_io);
	CHECK_EQ(flx_mo_option(&mo, "direct_io=1", &err), 0);
	CHECK(mo.direct_io);
	/* the flag grammar of pp_renumber (flx_parse_flag) */
	CHECK_EQ(flx_mo_option(&mo, "direct_io=false", &err), 0);
	CHECK(!mo.direct_io);
	CHECK_EQ(flx_mo_option(&mo, "direct_io=true", &err), 0);
	CHECK(mo.direct_io);
	CHECK(!mo.passthrough); /* off by default: it weakens a guarantee */
	CHECK_EQ(flx_mo_option(&mo, "passthrough", &err), 0);
	CHECK(mo.passthrough);
	CHECK_EQ(flx_mo_option(&mo, "passthrough=0", &err), 0);
	CHECK(!mo.passthrough);
	/* unset: sized to the largest strided chunk, within bounds */
	CHECK(mo.cache_size == FLX_MO_CACHE_AUTO);
	CHECK_EQ(flx_mo_cache_bytes(&mo, 0, 0), 64u << 20);
	CHECK_EQ(flx_mo_cache_bytes(&mo, 5u << 20, 16ull << 30), 64u << 20);
	CHECK_EQ(flx_mo_cache_bytes(&mo, (100u << 20) + 1, 16ull << 30),
		 103u << 20);
	CHECK_EQ(flx_mo_cache_bytes(&mo, 3ull << 30, 16ull << 30), 2ull << 30);
	CHECK_EQ(flx_mo_cache_bytes(&mo, 3ull << 30, 64ull << 30),
		 (3ull << 30) + (2u << 20));
	CHECK_EQ(flx_mo_cache_bytes(&mo, 9ull << 30, 0), 4ull << 30);
	CHECK_EQ(flx_mo_cache_bytes(&mo, 1ull << 30, 256u << 20), 64u << 20);
	CHECK_EQ(flx_mo_cache_bytes(&mo, UINT64_MAX - 5, 1ull << 50),
		 4ull << 30);
	CHECK_EQ(flx_mo_option(&mo, "cache_size=0", &err), 0);
	CHECK_EQ(flx_mo_cache_bytes(&mo, 100u << 20, 16ull << 30), 0);
	CHECK_EQ(mo.cache_size, 0);
	CHECK_EQ(flx_mo_option(&mo, "cache_size=1M", &err), 0);
	CHECK_EQ(mo.cache_size, 1u << 20);
	CHECK_EQ(flx_mo_option(&mo, "cache_size=3G", &err), 0);
	CHECK_EQ(mo.cache_size, 3ull << 30);
	CHECK_EQ(flx_mo_option(&mo, "cache_size=1T", &err), 0);
	CHECK_EQ(mo.cache_size, 1ull << 40);
	CHECK_EQ(flx_mo_cache_bytes(&mo, 5u << 20, 1u << 30), 1ull << 40);
	/* gpu, gpu_min, gpu_device: the slicer's options (gpu/slice.h) */
	CHECK_EQ(mo.gpu.mode, FLX_GPU_AUTO);
	CHECK_EQ(mo.gpu.min_bytes, FLX_GPU_MIN_DEFAULT);
	CHECK_EQ(mo.gpu.device, 0);
	CHECK(mo.gpu.library == NULL);
	CHECK_EQ(flx_mo_option(&mo, "gpu=on", &err), 0);
	CHECK_EQ(mo.gpu.mode, FLX_GPU_ON);
	CHECK_EQ(flx_mo_option(&mo, "gpu=off", &err), 0);
	CHECK_EQ(mo.gpu.mode, FLX_GPU_OFF);
	CHECK_EQ(flx_mo_option(&mo, "gpu=auto", &err), 0);
	CHECK_EQ(mo.gpu.mode, FLX_GPU_AUTO);
	CHECK_EQ(flx_mo_option(&mo, "gpu_min=0", &err), 0);
	CHECK_EQ(mo.gpu.min_bytes, 0);
	CHECK_EQ(flx_mo_option(&mo, "gpu_min=64M", &err), 0);
	CHECK_EQ(mo.gpu.min_bytes, 64u << 20);
	CHECK_EQ(mo.gpu.cache_bytes, FLX_GPU_CACHE_DEFAULT);
	CHECK_EQ(flx_mo_option(&mo, "gpu_cache=0", &err), 0);
	CHECK_EQ(mo.gpu.cache_bytes, 0);
	CHECK_EQ(flx_mo_option(&mo, "gpu_cache=256M", &err), 0);
	CHECK_EQ(mo.gpu.cache_bytes, 256u << 20);
	CHECK_EQ(mo.gpu.min_bytes, 64u << 20);
	CHECK_EQ(flx_mo_option(&mo, "gpu_device=7", &err), 0);
	CHECK_EQ(mo.gpu.device, 7);
	CHECK_EQ(flx_mo_option(&mo, "gpu_device=1023", &err), 0);
	CHECK_EQ(mo.gpu.device, 1023);
	CHECK_EQ(flx_mo_classify("gpu_device=1"), FLX_MO_OURS);
	/* source_format: any source's name, the last one given wins */
	CHECK(mo.source_format == NULL);
	CHECK_EQ(flx_mo_option(&mo, "source_format=torch-dcp", &err), 0);
	CHECK_STR(mo.source_format, "torch-dcp");
	CHECK_EQ(flx_mo_option(&mo, "source_format=hf-safetensors", &err), 0);
	CHECK_STR(mo.source_format, "hf-safetensors");
	flx_error_init(&err);
	CHECK_EQ(flx_mo_option(&mo, "source_format=zarr", &err), -EINVAL);
	{
		/* every source's name, in the registry's order: the list
		 * grows with the table of sources, not with this test */
		char want[512];
		size_t n = (size_t)snprintf(
		    want, sizeof(want), "'zarr' is not a checkpoint format (");
		const char *fmt;

		for (size_t i = 0; (fmt = flx_ckpt_format_name(i)); i++)
			n += (size_t)snprintf(want + n, sizeof(want) - n,
					      "%s%s", i ? ", " : "", fmt);
		snprintf(want + n, sizeof(want) - n, ")");
		CHECK_STR(err.text, want);
		CHECK(strstr(err.text,
			     "(megatron-torch_dist, megatron-zarr, "
			     "torch-dcp, paddle-dcp, hf-safetensors"));
	}
	CHECK_STR(mo.source_format, "hf-safetensors");
	/* paddle_id: a decimal id as Paddle names its files */
	CHECK(!flx_opt_given(&mo.spec.opts, "paddle_id"));
	CHECK_EQ(flx_mo_option(&mo, "paddle_id=0", &err), 0);
	CHECK(flx_opt_given(&mo.spec.opts, "paddle_id"));
	CHECK_EQ(opt_u64(&mo, "paddle_id"), 0);
	CHECK_EQ(flx_mo_option(&mo, "paddle_id=10", &err), 0);
	CHECK_EQ(opt_u64(&mo, "paddle_id"), 10);
	for (const char *const *v =
		 (const char *const[]){"paddle_id=", "paddle_id=-1",
				       "paddle_id=010", "paddle_id=1x",
				       "paddle_id=99999999999999999999",
				       "paddle_id", NULL};
	     *v; v++) {
		flx_error_init(&err);
		CHECK_EQ(flx_mo_option(&mo, *v, &err), -EINVAL);
		CHECK_STR(err.key, "paddle_id");
	}
	CHECK_EQ(opt_u64(&mo, "paddle_id"), 10);
	CHECK_EQ(mo.nfuse, 0); /* ours: libfuse never sees it */
	flx_mo_release(&mo);
	flx_mo_release(&mo); /* idempotent */

	unlink(good);
	unlink(bad);
	unlink(typo);
	rmdir(dir);
}

static void test_mountinfo(void)
{
	/* Two mounts on /mnt/a b (the later, topmost one wins), a non-FUSE
	 * mount on the same path, optional fields, and look-alike paths. */
	const char *mi =
	    "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
	    "40 22 0:50 / /mnt/a\\040b rw,nosuid - fuse.flexfs /ck ro\n"
	    "41 22 0:51 / /mnt/a rw shared:7 master:2 - fuse.flexfs /ck ro\n"
	    "42 40 0:52 / /mnt/a\\040b ro - fuse.flexfs /ck ro\n"
	    "43 22 0:53 / /mnt/a\\040b/c ro - fuse.flexfs /ck ro\n"
	    "44 22 0:54 / /mnt/t ro - tmpfs tmpfs rw\n"
	    "45 22 0:55 / /mnt/bs\\134x ro - fuseblk /dev/x ro";
	char dev[16];

	CHECK_EQ(flx_mo_mountinfo_dev(mi, "/mnt/a b", dev, sizeof(dev)), 0);
	CHECK_STR(dev, "0:52");
	CHECK_EQ(flx_mo_mountinfo_dev(mi, "/mnt/a", dev, sizeof(dev)), 0);
	CHECK_STR(dev, "0:51");
	CHECK_EQ(flx_mo_mountinfo_dev(mi, "/mnt/bs\\x", dev, sizeof(dev)), 0);
	CHECK_STR(dev, "0:55");
	CHECK_EQ(flx_mo_mountinfo_dev(mi, "/mnt/t", dev, sizeof(dev)), -ENOENT);
	CHECK_EQ(flx_mo_mountinfo_dev(mi, "/mnt", dev, sizeof(dev)), -ENOENT);
	CHECK_EQ(flx_mo_mountinfo_dev(mi, "/", dev, sizeof(dev)), -ENOENT);
	CHECK_EQ(flx_mo_mountinfo_dev(mi, "/mnt/a", dev, 4), -ENAMETOOLONG);
	CHECK_EQ(flx_mo_mountinfo_dev("", "/mnt/a", dev, sizeof(dev)), -ENOENT);
	CHECK_EQ(flx_mo_mountinfo_dev("garbage without fields\n\n", "/mnt/a",
				      dev, sizeof(dev)),
		 -ENOENT);
}

static void test_optstring(void)
{
	flx_mountopts mo;
	flx_error err;
	char *s = NULL, **tok = NULL;
	size_t n = 0;

	CHECK_EQ(flx_mo_init(&mo), 0);
	flx_error_init(&err);
	CHECK_EQ(flx_mo_set_source(&mo, "/data/ck,pt\\1"), 0);
	CHECK_EQ(
	    flx_mo_options(&mo,
			   "tp=2,noauto,_netdev,nofail,x-systemd.automount,"
			   "defaults,rw,allow_other,tpp=3,comment=x,"
			   "max_read=131072",
			   &err),
	    0);
	CHECK_EQ(err.code, 0);
	CHECK_EQ(mo.spec.tp, 2);
	CHECK_EQ(mo.nfuse, 3); /* the unknown tpp=3 goes to libfuse */
	CHECK_EQ(flx_mo_fuse_optstring(&mo, &s), 0);
	CHECK_STR(s, "allow_other,tpp=3,max_read=131072,ro,"
		     "default_permissions,subtype=flexfs,"
		     "fsname=/data/ck\\,pt\\\\1");
	/* libfuse's splitting gives the source back verbatim. */
	CHECK_EQ(flx_mo_split(s, &tok, &n), 0);
	CHECK_EQ(n, 7);
	if (n == 7)
		CHECK_STR(tok[6], "fsname=/data/ck,pt\\1");
	flx_mo_tokens_free(tok, n);
	free(s);

	/* The user's own fsname/subtype win, escaped on the way out. */
	CHECK_EQ(flx_mo_options(&mo, "fsname=my\\,ckpt,subtype=x", &err), 0);
	CHECK_EQ(flx_mo_fuse_optstring(&mo, &s), 0);
	CHECK_STR(s, "allow_other,tpp=3,max_read=131072,fsname=my\\,ckpt,"
		     "subtype=x,ro,default_permissions");
	free(s);

	/* The first error stops the list and is the one reported. */
	flx_error_init(&err);
	CHECK(flx_mo_options(&mo, "pp=2,tp=0,pp=abc", &err) < 0);
	CHECK_STR(err.key, "tp");
	CHECK_EQ(mo.spec.pp, 2);
	flx_mo_release(&mo);

	CHECK_EQ(flx_mo_init(&mo), 0);
	CHECK_EQ(flx_mo_fuse_optstring(&mo, &s), -EINVAL); /* no source */
	flx_mo_release(&mo);

	s = flx_mo_escape("a,b\\c,");
	CHECK_STR(s, "a\\,b\\\\c\\,");
	free(s);
}

static void check_argv(int argc, const char **argv, int wantc,
		       const char **want)
{
	char **out = NULL;
	int outc = -1;

	CHECK_EQ(flx_mo_argv(argc, (char **)argv, &outc, &out), 0);
	CHECK_EQ(outc, wantc);
	for (int i = 0; i < wantc && i < outc; i++)
		CHECK_STR(out[i], want[i]);
	CHECK(out && out[outc] == NULL);
	free(out);
}

static void test_argv(void)
{
	const char *helper[] = {"/sbin/mount.flexfs",
				"/ckpt",
				"/mnt",
				"-s",
				"-f",
				"-n",
				"-v",
				"-o",
				"tp=2,-f",
				"-t",
				"flexfs",
				"-tfuse.flexfs"};
	const char *helper_want[] = {"/sbin/mount.flexfs", "/ckpt", "/mnt",
				     "-o", "tp=2,-f"};
	const char *fuse_helper[] = {
	    "mount.fuse.flexfs", "/ckpt", "/mnt", "-o", "rw", "-v", "--", "-f"};
	const char *fuse_helper_want[] = {
	    "mount.fuse.flexfs", "/ckpt", "/mnt", "-o", "rw", "--", "-f"};
	/* As the program itself, -f/-s/-d are libfuse's and stay. */
	const char *plain[] = {
	    "/usr/bin/flexfs", "/ckpt", "/mnt", "-f", "-s", "-o", "tp=2"};

	check_argv(12, helper, 5, helper_want);
	check_argv(8, fuse_helper, 7, fuse_helper_want);
	check_argv(7, plain, 7, plain);
	check_argv(0, NULL, 0, NULL);

	CHECK(flx_mo_is_helper("mount.flexfs"));
	CHECK(flx_mo_is_helper("/sbin/mount.fuse.flexfs"));
	CHECK(!flx_mo_is_helper("flexfs"));
	CHECK(!flx_mo_is_helper("/opt/mount.d/flexfs"));
	CHECK(!flx_mo_is_helper("./flexfs-mount."));
	CHECK(!flx_mo_is_helper(NULL));
}

/* aoa_src_tp=: the fused statements' default source TP degree. */
static void test_aoa_src_tp(void)
{
	flx_mountopts mo;
	flx_error err;

	check_bad("aoa_src_tp", "aoa_src_tp");
	check_bad("aoa_src_tp=", "aoa_src_tp");
	check_bad("aoa_src_tp=0", "aoa_src_tp");
	check_bad("aoa_src_tp=-2", "aoa_src_tp");
	check_bad("aoa_src_tp=2x", "aoa_src_tp");
	check_bad("aoa_src_tp=65537", "aoa_src_tp");
	CHECK_EQ(flx_mo_classify("aoa_src_tp=2"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_init(&mo), 0);
	flx_error_init(&err);
	CHECK(!flx_opt_given(&mo.spec.opts, "aoa_src_tp")); /* unset */
	CHECK_EQ(flx_mo_option(&mo, "aoa_src_tp=2", &err), 0);
	CHECK_EQ(opt_u64(&mo, "aoa_src_tp"), 2);
	CHECK_EQ(flx_mo_option(&mo, "aoa_src_tp=65536", &err), 0);
	CHECK_EQ(opt_u64(&mo, "aoa_src_tp"), 65536);
	CHECK_EQ(flx_mo_option(&mo, "aoa_src_tp=1", &err), 0);
	CHECK_EQ(opt_u64(&mo, "aoa_src_tp"), 1);
	CHECK_EQ(mo.nfuse, 0);
	flx_mo_release(&mo);
}

/* log=FILE: ours, made absolute against the working directory, never
 * passed to libfuse; an empty value is refused */
static void test_log(void)
{
	flx_mountopts mo;
	flx_error err;
	char cwd[4096], want[4200];

	check_bad("log", "log");
	check_bad("log=", "log");
	CHECK_EQ(flx_mo_classify("log=/tmp/x.log"), FLX_MO_OURS);
	CHECK_EQ(flx_mo_init(&mo), 0);
	flx_error_init(&err);
	CHECK(mo.log_file == NULL);
	CHECK_EQ(flx_mo_option(&mo, "log=/var/log/flexfs.log", &err), 0);
	CHECK_STR(mo.log_file, "/var/log/flexfs.log");
	CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
	snprintf(want, sizeof(want), "%s/rel.log", cwd);
	CHECK_EQ(flx_mo_option(&mo, "log=rel.log", &err), 0);
	CHECK_STR(mo.log_file, want);
	CHECK_EQ(mo.nfuse, 0);
	flx_mo_release(&mo);
}

int main(void)
{
	test_split();
	test_classify();
	test_values();
	test_optstring();
	test_mountinfo();
	test_argv();
	test_aoa_src_tp();
	test_log();
	return CHECK_RESULT();
}
