/* kernels-x86/dispatch.c — picks the kernel table once from cpuid + xgetbv, capped by
 * EPYQ_MAX_ISA. The only file that knows every ISA.
 *
 * Tables: each level lists only the kernels it implements itself ("own" tables below);
 * build_tables() then fills every empty slot from the level beneath, so a level always
 * serves the best implementation at or below it and "ref" is the floor. Adding a kernel
 * for one level is one line in that level's own table (plus one INHERIT line per new
 * table entry).
 *
 * Detection follows the SDM: a feature counts only when cpuid reports it AND the OS saves
 * the register state it needs (XCR0 via xgetbv): YMM state for AVX2, opmask + both ZMM
 * halves for AVX-512. A VM or kernel that masks XSAVE features thus drops to a lower table
 * instead of faulting on the first vector instruction. */
#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/log.h"
#include "kernels-x86/kern_impl.h"
#include "kernels-x86/w4_impl.h"

static const char *const isa_names[EPYQ_ISA_COUNT] = {"ref",         "avx2",        "avx512",
                                                      "avx512_vnni", "avx512_bf16", "avx512_amx"};

/* ---- own tables: what each level implements itself --------------------------------- */

/* Any x86-64 (and the tests' double-checked twin of everything else). */
static const epyq_kern_table own_ref = {
    .bf16_gemm = epyq_bf16_gemm_ref,
    .bf16_gemm_f32 = epyq_bf16_gemm_f32_ref,
    .attn_bf16 = epyq_attn_bf16_ref,
    .attn_bf16_multi = epyq_attn_bf16_multi_ref,
    .attn_bf16_tile = epyq_attn_bf16_tile_ref,
    .gdn_step = epyq_gdn_step_ref,
    .gdn_seq = epyq_gdn_seq_ref,
    .conv_silu = epyq_conv_silu_ref,
    .l2norm = epyq_l2norm_ref,
    .gated_rmsnorm = epyq_gated_rmsnorm_ref,
    .stream_read = epyq_stream_read_ref,
    .f32_gemm = epyq_f32_gemm_ref,
    .act_prep = epyq_act_prep_ref,
    .w4_gemm = epyq_w4_gemm_ref,
    .w4_expert = epyq_w4_expert_ref,
    .w4_expert_gu = epyq_w4_expert_gu_ref,
    .w4_expert_down = epyq_w4_expert_down_ref,
    .w4_expert_scratch_bytes = epyq_w4_expert_scratch_bytes,
    .fill_normal = epyq_fill_normal_ref,
    .minmax = epyq_minmax_ref,
    .quant_codes = epyq_quant_codes_ref,
};

/* AVX2 + FMA + F16C: Intel Haswell (2013-) .. Alder Lake, AMD Zen 1/2/3 (EPYC Naples, Rome,
 * Milan). The fallback for every EPYC before Genoa. */
static const epyq_kern_table own_avx2 = {
    .bf16_gemm = epyq_bf16_gemm_avx2,
    .bf16_gemm_f32 = epyq_bf16_gemm_f32_avx2,
    .attn_bf16 = epyq_attn_bf16_avx2,
    .attn_bf16_multi = epyq_attn_bf16_multi_avx2,
    .attn_bf16_tile = epyq_attn_bf16_tile_avx2,
    .gdn_step = epyq_gdn_step_avx2,
    .gdn_seq = epyq_gdn_seq_avx2,
    .conv_silu = epyq_conv_silu_avx2,
    .l2norm = epyq_l2norm_avx2,
    .gated_rmsnorm = epyq_gated_rmsnorm_avx2,
    .stream_read = epyq_stream_read_avx2,
    .f32_gemm = epyq_f32_gemm_avx2,
    .w4_gemm = epyq_w4_gemm_avx2,
    .w4_expert = epyq_w4_expert_avx2,
    .w4_expert_gu = epyq_w4_expert_gu_avx2,
    .w4_expert_down = epyq_w4_expert_down_avx2,
    .fill_normal = epyq_fill_normal_avx2,
    .minmax = epyq_minmax_avx2,
    .quant_codes = epyq_quant_codes_avx2,
};

/* AVX-512 F/BW/VL/DQ: Intel Skylake-SP/X (2017-). No AMD part stops here. */
static const epyq_kern_table own_avx512 = {
    .act_prep = epyq_act_prep_avx512,
    .bf16_gemm = epyq_bf16_gemm_avx512,
    .bf16_gemm_f32 = epyq_bf16_gemm_f32_avx512,
    .attn_bf16 = epyq_attn_bf16_avx512,
    .attn_bf16_multi = epyq_attn_bf16_multi_avx512,
    .attn_bf16_tile = epyq_attn_bf16_tile_avx512,
    .gdn_step = epyq_gdn_step_avx512,
    .gdn_seq = epyq_gdn_seq_avx512,
    .conv_silu = epyq_conv_silu_avx512,
    .l2norm = epyq_l2norm_avx512,
    .gated_rmsnorm = epyq_gated_rmsnorm_avx512,
    .stream_read = epyq_stream_read_avx512,
    .f32_gemm = epyq_f32_gemm_avx512,
};

/* + VNNI (VPDPBUSD, VPDPWSSD): Intel Cascade Lake (2019-), Ice Lake. Dense kernels are those
 * of avx512; both int4 paths gain their VNNI cores here (A8 VPDPBUSD, A16 VPDPWSSD). */
static const epyq_kern_table own_avx512_vnni = {
    .w4_gemm = epyq_w4_gemm_avx512vnni,
    .w4_expert = epyq_w4_expert_avx512vnni,
    .w4_expert_gu = epyq_w4_expert_gu_avx512vnni,
    .w4_expert_down = epyq_w4_expert_down_avx512vnni,
    .bf16_gemm = NULL,
};

/* + BF16 (VDPBF16PS): Intel Cooper Lake, Sapphire Rapids (2023-); AMD Zen 4 (EPYC Genoa,
 * Bergamo, Siena; 2022-) and Zen 5 (EPYC Turin; 2024-) — the targets of this project. */
static const epyq_kern_table own_avx512_bf16 = {
    .bf16_gemm = epyq_bf16_gemm_avx512bf16,
};

/* + AMX-TILE/AMX-INT8: Intel Sapphire Rapids (2023-) and later Xeons. No EPYC has AMX, so
 * this level only lifts prompt processing on Intel hosts: the A16 int4 core runs on tiles
 * once 16 or more activation rows share the weights (same bits as every other level). */
static const epyq_kern_table own_avx512_amx = {
    .w4_gemm = epyq_w4_gemm_amx,
    .w4_expert = epyq_w4_expert_amx,
    .w4_expert_gu = epyq_w4_expert_gu_amx,
    .w4_expert_down = epyq_w4_expert_down_amx,
};

static const epyq_kern_table *const own[EPYQ_ISA_COUNT] = {
    &own_ref, &own_avx2, &own_avx512, &own_avx512_vnni, &own_avx512_bf16, &own_avx512_amx};

/* ---- effective tables ---------------------------------------------------------------- */

static epyq_kern_table tables[EPYQ_ISA_COUNT];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* Level l = own[l], with every NULL slot taken from level l-1 (already complete). */
static void build_tables(void) {
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        epyq_kern_table *t = &tables[l];
        *t = *own[l];
        t->name = isa_names[l];
        t->isa = (epyq_isa)l;
        if (l == 0) continue;
        const epyq_kern_table *lower = &tables[l - 1];
#define INHERIT(f)                                                                               \
    if (!t->f) t->f = lower->f
        INHERIT(act_prep);
        INHERIT(w4_gemm);
        INHERIT(w4_expert);
        INHERIT(w4_expert_gu);
        INHERIT(w4_expert_down);
        INHERIT(w4_expert_scratch_bytes);
        INHERIT(bf16_gemm);
        INHERIT(bf16_gemm_f32);
        INHERIT(attn_bf16);
        INHERIT(attn_bf16_multi);
        INHERIT(attn_bf16_tile);
        INHERIT(gdn_step);
        INHERIT(gdn_seq);
        INHERIT(conv_silu);
        INHERIT(l2norm);
        INHERIT(gated_rmsnorm);
        INHERIT(stream_read);
        INHERIT(f32_gemm);
        INHERIT(fill_normal);
        INHERIT(minmax);
        INHERIT(quant_codes);
#undef INHERIT
    }
}

/* ---- host detection ------------------------------------------------------------------ */

/* XCR0 bits (Intel SDM vol. 1, 13.1): 1 SSE, 2 AVX (YMM upper), 5 opmask, 6 ZMM_Hi256,
 * 7 Hi16_ZMM. */
#define XCR0_YMM 0x06u
#define XCR0_ZMM 0xe6u
/* 17 XTILECFG, 18 XTILEDATA. */
#define XCR0_AMX 0x60000u

/* Linux enables tile data lazily: a process must ask once (arch_prctl ARCH_REQ_XCOMP_PERM
 * for XFEATURE_XTILEDATA, Linux >= 5.16) or its first tile instruction faults. The grant
 * covers every thread of the process. Refused (older kernel, seccomp, a VM that hides the
 * state): the host stays at avx512_bf16. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_permitted(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static epyq_isa detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return EPYQ_ISA_REF;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1,
              f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return EPYQ_ISA_REF;
    const uint64_t xcr0 = xgetbv0();
    if ((xcr0 & XCR0_YMM) != XCR0_YMM) return EPYQ_ISA_REF;

    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return EPYQ_ISA_REF;
    const int avx2 = (b >> 5) & 1;
    if (!(avx2 && fma && f16c)) return EPYQ_ISA_REF;
    const int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const int vnni = (c >> 11) & 1;
    if (!(f && dq && bw && vl) || (xcr0 & XCR0_ZMM) != XCR0_ZMM) return EPYQ_ISA_AVX2;
    if (!vnni) return EPYQ_ISA_AVX512;

    unsigned a1 = 0, b1, c1, d1;
    const int bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && ((a1 >> 5) & 1);
    if (!bf16) return EPYQ_ISA_AVX512_VNNI;
    const int amx = ((d >> 24) & 1) && ((d >> 25) & 1); /* AMX-TILE, AMX-INT8 */
    return amx && (xcr0 & XCR0_AMX) == XCR0_AMX && amx_permitted() ? EPYQ_ISA_AVX512_AMX
                                                                   : EPYQ_ISA_AVX512_BF16;
}

static epyq_isa host_isa;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static void detect_host(void) { host_isa = detect(); }

epyq_isa epyq_cpu_isa(void) {
    pthread_once(&host_once, detect_host);
    return host_isa;
}

/* ---- names, selection ---------------------------------------------------------------- */

const char *epyq_isa_name(epyq_isa isa) {
    return (unsigned)isa < EPYQ_ISA_COUNT ? isa_names[isa] : "unknown";
}

int epyq_numpath_parse(const char *s) {
    if (!strcmp(s, "a16")) return EPYQ_PATH_A16;
    if (!strcmp(s, "a8")) return EPYQ_PATH_A8;
    return -1;
}

int epyq_isa_parse(const char *s) {
    if (!s) return -1;
    for (int l = 0; l < EPYQ_ISA_COUNT; l++)
        if (strcmp(s, isa_names[l]) == 0) return l;
    return -1;
}

const epyq_kern_table *epyq_kern_for_isa(epyq_isa isa) {
    if ((unsigned)isa >= EPYQ_ISA_COUNT || isa > epyq_cpu_isa()) return NULL;
    pthread_once(&tables_once, build_tables);
    return &tables[isa];
}

epyq_status epyq_kern_select(epyq_isa host, const char *cap, const epyq_kern_table **out,
                             epyq_err *err) {
    *out = NULL;
    if ((unsigned)host >= EPYQ_ISA_COUNT)
        return epyq_err_set(err, EPYQ_E_INTERNAL, "kernel dispatch: host ISA %d out of range",
                            (int)host);
    epyq_isa isa = host;
    if (cap && *cap) {
        const int c = epyq_isa_parse(cap);
        if (c < 0)
            return epyq_err_set(err, EPYQ_E_ARG,
                                "EPYQ_MAX_ISA=%.64s: expected one of ref, avx2, avx512, "
                                "avx512_vnni, avx512_bf16, avx512_amx",
                                cap);
        /* A cap above what the host has is a ceiling, not a request: stay at the host. */
        if ((epyq_isa)c < isa) isa = (epyq_isa)c;
    }
    pthread_once(&tables_once, build_tables);
    *out = &tables[isa];
    return EPYQ_OK;
}

static const epyq_kern_table *process_table;
static epyq_status process_status;
static epyq_err process_err;
static pthread_once_t process_once = PTHREAD_ONCE_INIT;

static void pick_process_table(void) {
    process_status = epyq_kern_select(epyq_cpu_isa(), getenv("EPYQ_MAX_ISA"), &process_table,
                                      &process_err);
    if (process_status != EPYQ_OK) epyq_kern_select(EPYQ_ISA_REF, NULL, &process_table, NULL);
}

/* Library callers that skipped epyq_kern_init() still hear about a bad cap, once; callers
 * of epyq_kern_init() got the error themselves and are not told twice. */
static pthread_once_t report_once = PTHREAD_ONCE_INIT;

static void reported_by_caller(void) {}

epyq_status epyq_kern_init(epyq_err *err) {
    pthread_once(&process_once, pick_process_table);
    pthread_once(&report_once, reported_by_caller);
    if (process_status != EPYQ_OK && err) *err = process_err;
    return process_status;
}

static void report_table(void) {
    if (process_status != EPYQ_OK)
        epyq_log_error("%s; using the ref kernels", process_err.msg);
    epyq_log_debug("kernels: table %s (host %s)", process_table->name,
                   epyq_isa_name(epyq_cpu_isa()));
}

const epyq_kern_table *epyq_kern(void) {
    pthread_once(&process_once, pick_process_table);
    pthread_once(&report_once, report_table);
    return process_table;
}
