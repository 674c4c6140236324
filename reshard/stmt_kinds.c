/* SPDX-License-Identifier: MIT */
/*
 * The transforms whose statements a rules file may carry (spec.h), in
 * the order their keys are looked for.  Adding one: its flx_stmt_kind
 * and an entry here.
 */
#include "aoa.h"
#include "spec.h"

const flx_stmt_kind *const flx_stmt_kinds[] = {&flx_aoa_stmt_kind, NULL};
