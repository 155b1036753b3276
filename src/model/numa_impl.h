/* src/model/numa_impl.h — the model's NUMA state, shared by numa_moe.c (plan, pools, routed
 * experts), numa_dense.c (dense linears) and numa_state.c (per-head work and buffers). Included
 * by those files only. */
#ifndef EPYQ_MODEL_NUMA_IMPL_H
#define EPYQ_MODEL_NUMA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model_impl.h"
#include "numa/dispatch.h"
#include "numa/place.h"

/* Weight bytes each group's pool read since the last reset, by where the memory is: "local"
 * when move_pages found every page of the buffer on the group's node at load. */
typedef struct {
    uint64_t local, remote;
} epyq_numa_reads;

/* One group's share of a DeltaNet layer's (sequence, head) tasks (numa_state.c). */
typedef struct {
    epyq_task_fn fn;
    void *ctx;
    const int32_t *tasks; /* [n] task ids of the single-pool numbering */
    int32_t n;
    int32_t worker0; /* this group's first worker in a numbering unique over all pools */
} epyq_numa_head_job;

struct epyq_model_numa {
    epyq_numa_setup *setup;
    epyq_moe_dispatch *disp;
    int32_t n_groups;
    int32_t n_layers;    /* trunk layers, + 1 for the MTP layer when loaded with int4 experts */
    int32_t slice;       /* intermediate rows per unit (multiple of the int4 group size) */
    int32_t n_slices;    /* slices per expert: ceil(I / slice), each placed on its plan group */
    epyq_w4 *eslices;    /* [n_layers][E][n_slices][3] each slice's gate rows, up rows and down
                            columns (epyq_w4_view / epyq_w4_cols copies) in its group's buffer */
    char name[64];       /* the model as the placement table names it */
    epyq_numa_buf *bufs; /* [n_groups] the routed expert slices of each group, all layers */
    size_t *used;        /* [n_groups] bytes of bufs[g] holding them */
    bool *bufs_local;    /* [n_groups] bufs[g] verified on g's node */
    /* dense linears (numa_dense.c) */
    int32_t n_dense;
    epyq_rlin **dense;       /* [n_dense] the model's dense linears */
    int32_t *row0;           /* [n_dense][n_groups + 1] row boundaries */
    epyq_rlin *parts;        /* [n_dense][n_groups] */
    epyq_rlin_split *splits; /* [n_dense] */
    epyq_numa_buf *dbufs;    /* [n_groups] each group's slices or copy */
    size_t *dused;           /* [n_groups] bytes of dbufs[g] in use */
    bool *dbufs_local;       /* [n_groups] dbufs[g] verified on g's node */
    void *jobs;              /* [n_groups] scratch of a dense run (numa_dense.c) */
    /* per-head work and buffers (numa_state.c) */
    int32_t *head_group;           /* [Hv] group owning each DeltaNet value head's state */
    int32_t *key_group;            /* [Hk] group owning each key head's conv channels */
    int32_t *kv_group;             /* [nkv] group owning each attention kv head's cache */
    epyq_numa_head_job *head_jobs; /* [n_groups] */
    int32_t head_workers;          /* workers over all pools */
    epyq_numa_reads *reads;        /* [n_groups] weights and sequence buffers */
    epyq_numa_reads *sreads;       /* [n_groups] of reads: the sequence buffers (KV, conv, S) */
    uint64_t unpinned;             /* weight bytes read by the model's own (unpinned) pool */
};

/* Attention kv heads, DeltaNet key and value heads shared out to the groups; freed by
 * epyq_numa_heads_free. */
epyq_status epyq_numa_heads_init(epyq_model *m, epyq_err *err);
void epyq_numa_heads_free(epyq_model *m);

/* Plan layer (trunk l, MTP = L) of a layer's runtime weights, or -1. */
int32_t epyq_numa_layer_index(const epyq_model *m, const epyq_moe_rw *mw);

#endif
