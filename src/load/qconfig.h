/* src/load/qconfig.h — private to src/load: the quantisation_config parser behind config.c.
 *
 * Promise: epyq_qconfig_parse() accepts exactly the schemes the runtime decodes (int4, group
 * 32/64/128, weight-only: GPTQ v1/v2, compressed-tensors pack-quantized, Quark int4/uint4
 * real_quantized, AutoAWQ GEMM) and refuses everything else with EPYQ_E_QUANT naming the
 * offending key and value. Per-module rules (GPTQ `dynamic`, compressed-tensors `targets` and
 * `ignore`, Quark `exclude`, AWQ `modules_to_not_convert`) are compiled once here and answered
 * by epyq_qconfig_for(). */
#ifndef EPYQ_LOAD_QCONFIG_H
#define EPYQ_LOAD_QCONFIG_H

#include <cjson/cJSON.h>

#include "load/model_config.h"

/* qc: the quantization_config object. Fills cfg->qformat, gptq_version, quark_reorder, qc. */
epyq_status epyq_qconfig_parse(epyq_config *cfg, const cJSON *qc, const char *label, epyq_err *err);
void epyq_qconfig_free(epyq_qconfig *qc);
/* The base scheme (what an unexcluded module gets), for summaries. */
epyq_qscheme epyq_qconfig_base(const epyq_qconfig *qc);

#endif
