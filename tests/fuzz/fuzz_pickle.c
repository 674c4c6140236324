/* SPDX-License-Identifier: MIT */
/* Fuzz target: the restricted pickle VM, then a bounded walk of the tree
 * through the public helpers (what interpreters do with it). */
#include "pickle.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Memo sharing makes the tree a DAG (even cyclic), so a depth bound alone
 * still allows an exponential walk: every walker also needs a budget. */
static size_t budget;

static size_t walk(const flx_pv *v, int depth)
{
	size_t n = 1;

	if (!v || depth > FLX_PV_MAX_WALK_DEPTH || budget == 0)
		return 0;
	budget--;
	switch (v->kind) {
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		for (size_t i = 0; i < flx_pv_len(v); i++)
			n += walk(flx_pv_item(v, i), depth + 1);
		break;
	case FLX_PV_DICT:
		for (size_t i = 0; i < v->u.dict.n; i++)
			n += walk(v->u.dict.kv[2 * i + 1], depth + 1);
		(void)flx_pv_dict_get(v, "state_dict_metadata");
		break;
	case FLX_PV_OBJ:
		(void)flx_pv_is_obj_of(v, "Metadata");
		n += walk(v->u.obj.args, depth + 1);
		n += walk(v->u.obj.state, depth + 1);
		break;
	default:
		(void)flx_pv_str(v);
		(void)flx_pv_payload(v, NULL, NULL);
		break;
	}
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flx_pickle *p = NULL;

	budget = 1u << 16;
	if (flx_pickle_load(data, size, "fuzz", NULL, &p, NULL) == 0)
		walk(flx_pickle_root(p), 0);
	flx_pickle_free(p);
	return 0;
}
