/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_PLUGINS_H
#define FLX_FS_PLUGINS_H

/*
 * The registry of the plugins' options: where the tables of the sources
 * (resolver/sources.c), the transforms and the layouts (fs/layouts/
 * table.c) meet.  The option parser (mountopts/), the programs' --help,
 * the man pages and the README's option table enumerate it; none of them
 * names a plugin.
 *
 * Thread-safety: static tables; every function is pure.
 */

#include "opt.h"

#include <stddef.h>

/**
 * The i-th (from 0) option group of the plugins: the sources' (in probe
 * order), then the transforms', then the layouts' (in table order); a
 * group shared by several plugins comes once, where first met.
 * @return the group (static), or NULL past the last.
 */
const flx_opt_group *flx_plugin_group(size_t i);

/**
 * The plugin option named name, and its group in *group (may be NULL).
 * @return the option (static), or NULL when no plugin declares it.
 */
const flx_opt *flx_plugin_opt(const char *name, const flx_opt_group **group);

#endif
