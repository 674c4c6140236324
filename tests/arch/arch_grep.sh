#!/bin/sh
# SPDX-License-Identifier: MIT
# The core names no framework: the checkpoint index (resolver/ckpt.h,
# resolver/index.c and its parts resolver/index_*), the target spec and its plan and views
# (reshard/spec.*, plan.c, view.c), the tree (fs/tree.c), the FUSE
# adapter (fs/fuse_*.c), the option layer (mountopts/), the option
# tables (resolver/common/opt.*), the sources' common hooks
# (resolver/dirview.c) and the distributed mount's backend
# (resolver/remote/mpi_mount.*).  A framework's facts and options live in
# its plugin (resolver/<source>/, reshard/<transform>, fs/layouts/), reached
# through flx_ckpt_fact() and the option registry (fs/plugins.h).
#
# Words refused, case-insensitive, in code and comments alike:
#   frameworks and their tools: megatron, mcore, paddle, mindspore,
#     deepspeed, torchtitan, pytorch, hugging (Hugging Face)
#   their formats and file kinds: safetensors, dcp, distcp, zarr,
#     torch_dist, pdparams, pdopt, msckpt
#   their model facts and statements: swiglu, aoa
#   plugin prefixes: flx_mlg_, flx_ms_, flx_pd_, hf_ (a Hugging Face
#     layout's own names), mst_
# Allowed: hf_shard_size / HF_SHARD_SIZE, the view option every mount
# records in index.json (the hf/ layout is one of the default layouts
# every mount builds).  "torch" alone stays allowed: torch.chunk and
# torch.save describe the sharding and archive conventions the core itself
# implements.
#
# Usage: arch_grep.sh SRCDIR.  Exit 1, naming file:line, on any hit.
set -eu
src=${1:-.}
cd "$src"
words='megatron|mcore|paddle|mindspore|deepspeed|torchtitan|pytorch|hugging'
words="$words|safetensors|dcp|distcp|zarr|torch_dist|pdparams|pdopt|msckpt"
words="$words|swiglu|aoa|flx_mlg_|flx_ms_|flx_pd_|hf_|mst_"
files="resolver/ckpt.h resolver/index.c reshard/spec.c reshard/spec.h
reshard/plan.c reshard/view.c fs/tree.c resolver/common/opt.c
resolver/common/opt.h"
files="$files resolver/dirview.c resolver/remote/mpi_mount.c resolver/remote/mpi_mount.h"
files="$files $(ls fs/fuse_*.c mountopts/* resolver/index_*.[ch])"
hits=$(for f in $files; do
	[ -f "$f" ] || { echo "$f: missing (the list is out of date)"; continue; }
	sed -e 's/hf_shard_size//g; s/HF_SHARD_SIZE//g' "$f" |
		grep -niE "$words" | sed "s|^|$f:|"
done)
if [ -n "$hits" ]; then
	echo "framework names in the core (see $0):"
	echo "$hits"
	exit 1
fi
echo "arch_grep: ok ($(echo $files | wc -w) files)"
