/* kernels-x86/dnnl_gemm.c — oneDNN 2.6 (v2 C API) bf16 matmul with a primitive cache.
 * See dnnl_gemm.h for the contract. oneDNN 2.6 needs src and weights of the same type for a
 * bf16 matmul, so x is rounded to bf16 into a per-call buffer (m*k*2 bytes: small next to
 * the m*n*k work this path is used for). W is described in place as the k x n matrix with
 * strides {1, k}: no copy or reorder of the weights. */
#include "config.h"

#include "kernels-x86/dnnl_gemm.h"

#ifdef EPYQ_HAVE_DNNL

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/util.h"

#define CACHE_SLOTS 32

typedef struct {
    int64_t m, n, k, ldy;   /* shape key */
    uint64_t last_use;      /* LRU clock value */
    int refs;               /* calls running with this primitive (guarded by cache_mu) */
    int temp;               /* heap slot outside the cache, freed after its one call */
    dnnl_primitive_t prim;  /* NULL = free slot */
    dnnl_memory_desc_t src_md, wei_md, dst_md;
} gemm_slot;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static gemm_slot cache[CACHE_SLOTS];
static uint64_t cache_clock;
static dnnl_engine_t engine;

/* OpenMP controls found at run time, so linking does not depend on which runtime provides
 * them (libomp has both, libgomp only the first). */
static void (*omp_set_threads_fn)(int);
static void (*kmp_set_blocktime_fn)(int);
static pthread_once_t omp_once = PTHREAD_ONCE_INIT;

static void find_omp_controls(void) {
    *(void **)&omp_set_threads_fn = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    *(void **)&kmp_set_blocktime_fn = dlsym(RTLD_DEFAULT, "kmp_set_blocktime");
}

int epyq_dnnl_available(void) { return 1; }

/* Build the primitive for one shape (cache_mu held). */
static epyq_status slot_build(gemm_slot *s, int64_t m, int64_t n, int64_t k, int64_t ldy,
                              epyq_err *err) {
    const dnnl_dims_t sd = {m, k}, wd = {k, n}, dd = {m, n};
    const dnnl_dims_t ss = {k, 1}, ws = {1, k}, ds = {ldy, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_memory_desc_init_by_strides(&s->src_md, 2, sd, dnnl_bf16, ss) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&s->wei_md, 2, wd, dnnl_bf16, ws) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&s->dst_md, 2, dd, dnnl_f32, ds) != dnnl_success ||
        dnnl_matmul_desc_init(&desc, &s->src_md, &s->wei_md, NULL, &s->dst_md) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) != dnnl_success)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                            "oneDNN: no bf16 matmul for m=%lld n=%lld k=%lld",
                            (long long)m, (long long)n, (long long)k);
    const dnnl_status_t rc = dnnl_primitive_create(&s->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (rc != dnnl_success)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "oneDNN: primitive creation failed (%d)",
                            (int)rc);
    s->m = m;
    s->n = n;
    s->k = k;
    s->ldy = ldy;
    return EPYQ_OK;
}

/* The slot for a shape, built in the least recently used idle slot on a miss, with a
 * reference held so no other thread recycles it while it runs. When every slot is busy
 * (more concurrent shapes than slots) the primitive is built in a heap slot of its own and
 * destroyed after the call. */
static epyq_status slot_acquire(int64_t m, int64_t n, int64_t k, int64_t ldy, gemm_slot **out,
                                epyq_err *err) {
    epyq_status st = EPYQ_OK;
    *out = NULL;
    pthread_mutex_lock(&cache_mu);
    if (!engine && dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
        engine = NULL;
        st = epyq_err_set(err, EPYQ_E_UNSUPPORTED, "oneDNN: cannot create the CPU engine");
        goto out;
    }
    gemm_slot *hit = NULL, *lru = NULL;
    for (int i = 0; i < CACHE_SLOTS; i++) {
        gemm_slot *s = &cache[i];
        if (s->prim && s->m == m && s->n == n && s->k == k && s->ldy == ldy) {
            hit = s;
            break;
        }
        if (s->refs == 0 && (!lru || s->last_use < lru->last_use)) lru = s;
    }
    if (!hit) {
        if (lru) {
            if (lru->prim) dnnl_primitive_destroy(lru->prim);
            *lru = (gemm_slot){0};
            hit = lru;
        } else if (!(hit = calloc(1, sizeof *hit))) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "oneDNN gemm: primitive slot");
            goto out;
        } else {
            hit->temp = 1;
        }
        if ((st = slot_build(hit, m, n, k, ldy, err)) != EPYQ_OK) {
            if (hit->temp) free(hit);
            hit = NULL;
            goto out;
        }
    }
    hit->last_use = ++cache_clock;
    hit->refs++;
    *out = hit;
out:
    pthread_mutex_unlock(&cache_mu);
    return st;
}

static void slot_release(gemm_slot *s) {
    pthread_mutex_lock(&cache_mu);
    s->refs--;
    pthread_mutex_unlock(&cache_mu);
    if (s->temp) {
        dnnl_primitive_destroy(s->prim);
        free(s);
    }
}

epyq_status epyq_dnnl_gemm_bf16(const float *x, int32_t m, int32_t k, const uint16_t *w,
                                int32_t n, float *y, int32_t ldy, int32_t threads,
                                epyq_err *err) {
    if (m < 1 || n < 1 || k < 1 || ldy < n || threads < 1)
        return epyq_err_set(err, EPYQ_E_ARG, "oneDNN gemm: m=%d n=%d k=%d ldy=%d threads=%d",
                            m, n, k, ldy, threads);
    size_t xb_bytes;
    if (!epyq_mul_size((size_t)m * (size_t)k, sizeof(uint16_t), &xb_bytes))
        return epyq_err_set(err, EPYQ_E_ARG, "oneDNN gemm: m*k overflows");
    uint16_t *xb = malloc(xb_bytes);
    if (!xb) return epyq_err_set(err, EPYQ_E_NOMEM, "oneDNN gemm: %zu bytes for bf16 x", xb_bytes);
    gemm_slot *s;
    epyq_status st = slot_acquire(m, n, k, ldy, &s, err);
    if (st != EPYQ_OK) {
        free(xb);
        return st;
    }
    for (size_t i = 0; i < (size_t)m * (size_t)k; i++) xb[i] = epyq_f32_to_bf16(x[i]);

    pthread_once(&omp_once, find_omp_controls);
    if (omp_set_threads_fn) omp_set_threads_fn(threads);
    if (kmp_set_blocktime_fn) kmp_set_blocktime_fn(0);

    dnnl_memory_t ms = NULL, mw = NULL, md = NULL;
    dnnl_stream_t stream = NULL;
    if (dnnl_memory_create(&ms, &s->src_md, engine, xb) != dnnl_success ||
        dnnl_memory_create(&mw, &s->wei_md, engine, (void *)w) != dnnl_success ||
        dnnl_memory_create(&md, &s->dst_md, engine, y) != dnnl_success ||
        dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "oneDNN gemm: cannot create memory objects");
        goto done;
    }
    const dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}};
    if (dnnl_primitive_execute(s->prim, stream, 3, args) != dnnl_success ||
        dnnl_stream_wait(stream) != dnnl_success)
        st = epyq_err_set(err, EPYQ_E_INTERNAL, "oneDNN gemm: execution failed (m=%d n=%d k=%d)",
                          m, n, k);
done:
    if (stream) dnnl_stream_destroy(stream);
    if (md) dnnl_memory_destroy(md);
    if (mw) dnnl_memory_destroy(mw);
    if (ms) dnnl_memory_destroy(ms);
    free(xb);
    slot_release(s);
    return st;
}

void epyq_dnnl_release(void) {
    pthread_mutex_lock(&cache_mu);
    int busy = 0;
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (cache[i].refs > 0) {
            busy = 1; /* a call is running: leave it its primitive and the engine */
            continue;
        }
        if (cache[i].prim) dnnl_primitive_destroy(cache[i].prim);
        cache[i] = (gemm_slot){0};
    }
    if (engine && !busy) {
        dnnl_engine_destroy(engine);
        engine = NULL;
    }
    pthread_mutex_unlock(&cache_mu);
}

#else /* !EPYQ_HAVE_DNNL */

int epyq_dnnl_available(void) { return 0; }

epyq_status epyq_dnnl_gemm_bf16(const float *x, int32_t m, int32_t k, const uint16_t *w,
                                int32_t n, float *y, int32_t ldy, int32_t threads,
                                epyq_err *err) {
    (void)x, (void)m, (void)k, (void)w, (void)n, (void)y, (void)ldy, (void)threads;
    return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "oneDNN gemm: built without oneDNN");
}

void epyq_dnnl_release(void) {}

#endif
