/* tests/unit/numa_topo_util.h — what test_numa_topo and test_numa_plan both need: the
 * NPS4 synthetic topology, the XML topologies under numa/topologies, and a load that fails the
 * test with epyq's message instead of returning a status. */
#ifndef EPYQ_TESTS_NUMA_TOPO_UTIL_H
#define EPYQ_TESTS_NUMA_TOPO_UTIL_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "numa/topo.h"

#define GIB (1ull << 30)
#define NPS4 "pack:2 numa:4(memory=192GiB) core:8 pu:2"

/* numa/topologies/<name> under $EPYQ_SRCDIR (a static buffer: one path at a time). */
static inline const char *xml_path(const char *name) {
    static char buf[4096];
    const char *src = getenv("EPYQ_SRCDIR");
    snprintf(buf, sizeof buf, "%s/numa/topologies/%s", src && *src ? src : ".", name);
    return buf;
}

static inline epyq_topo *load(const char *spec) {
    epyq_topo *t = NULL;
    epyq_err err = {0};
    epyq_status st = epyq_topo_load(&t, spec, &err);
    ck_assert_msg(st == EPYQ_OK, "load %s: %s", spec ? spec : "(this machine)", err.msg);
    return t;
}

static inline void list_str(const int32_t *v, int32_t n, char *buf, size_t size) {
    epyq_topo_format_list(v, n, buf, size);
}

#endif
