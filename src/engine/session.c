/* src/engine/session.c — see session.h. */
#include "engine/session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"

#define HDR 80
static const char magic[8] = {'E', 'P', 'Y', 'Q', 'S', 'E', 'S', 'S'};

/* FNV-1a over 8-byte words, then the tail bytes: a word at a time keeps a real model's ~90 MB
 * state to a fraction of a second. Each step (xor, multiply by an odd number, xor-shift) is a
 * bijection of the running value, so one corrupt word always changes the sum; the shift also
 * carries high bits down, which a multiply alone never does. Each piece of the body is hashed
 * on its own, chained, so writer and reader need not concatenate them. */
static uint64_t sum(uint64_t h, const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint64_t i = 0, w;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 32;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
#define SUM0 1469598103934665603ull

static uint64_t body_sum(const epyq_session *s) {
    uint64_t h = sum(SUM0, s->ids, (uint64_t)s->n_ids * sizeof *s->ids);
    h = sum(h, s->conv, s->conv_len);
    return sum(h, s->snap, s->snap_len);
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static const char *kv_name(int32_t k) { return k == 0 ? "bf16" : k == 1 ? "fp8" : "unknown"; }

epyq_status epyq_session_write(const char *path, const epyq_session *s, epyq_err *err) {
    uint64_t ids_b = (uint64_t)s->n_ids * sizeof *s->ids;
    size_t total = 0;
    if (s->n_ids < 0 || !epyq_add_size(HDR, (size_t)ids_b, &total) ||
        !epyq_add_size(total, (size_t)s->conv_len, &total) ||
        !epyq_add_size(total, (size_t)s->snap_len, &total))
        return epyq_err_set(err, EPYQ_E_ARG, "%s: session sizes overflow", path);
    uint8_t *buf = malloc(total);
    if (!buf)
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: a %zu-byte session: out of memory", path,
                            total);
    memset(buf, 0, HDR);
    memcpy(buf, magic, 8);
    put32(buf + 8, EPYQ_SESSION_VERSION), put32(buf + 12, HDR);
    put64(buf + 16, s->id.model_id);
    put32(buf + 24, (uint32_t)s->id.kv_type), put32(buf + 28, (uint32_t)s->id.n_ctx);
    put32(buf + 32, (uint32_t)s->n_ids);
    put64(buf + 40, s->conv_len), put64(buf + 48, s->snap_len);
    put64(buf + 56, body_sum(s));
    put64(buf + 64, sum(SUM0, buf, 64));
    uint8_t *p = buf + HDR;
    if (ids_b) memcpy(p, s->ids, (size_t)ids_b), p += ids_b;
    if (s->conv_len) memcpy(p, s->conv, (size_t)s->conv_len), p += s->conv_len;
    if (s->snap_len) memcpy(p, s->snap, (size_t)s->snap_len);
    epyq_status st = epyq_file_write_atomic(path, buf, total, err);
    free(buf);
    return st;
}

bool epyq_session_sniff(const char *path) {
    FILE *f = fopen(path, "rb");
    char m[8];
    bool yes = f && fread(m, 1, 8, f) == 8 && !memcmp(m, magic, 8);
    if (f) fclose(f);
    return yes;
}

/* Checks of the fixed header against the file's length; the identity comes after. */
static epyq_status check_header(const char *path, const uint8_t *h, uint64_t file_len,
                                epyq_err *err) {
    if (memcmp(h, magic, 8))
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: magic: expected \"EPYQSESS\" (an epyq chat session), found %02x "
                            "%02x %02x %02x...",
                            path, h[0], h[1], h[2], h[3]);
    if (get32(h + 8) != EPYQ_SESSION_VERSION)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: version: expected %u, found %u (written by another epyq)", path,
                            EPYQ_SESSION_VERSION, get32(h + 8));
    if (get64(h + 64) != sum(SUM0, h, 64) || get32(h + 12) != HDR)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: header checksum: stored %016llx, computed %016llx (corrupt file)",
                            path, (unsigned long long)get64(h + 64),
                            (unsigned long long)sum(SUM0, h, 64));
    int32_t n_ids = (int32_t)get32(h + 32);
    uint64_t conv = get64(h + 40), snap = get64(h + 48), need = HDR;
    if (n_ids < 0 || __builtin_add_overflow(need, (uint64_t)n_ids * 4, &need) ||
        __builtin_add_overflow(need, conv, &need) || __builtin_add_overflow(need, snap, &need) ||
        need != file_len)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: size: the header describes %d tokens, %llu conversation and "
                            "%llu state bytes; the file has %llu bytes (truncated or corrupt)",
                            path, n_ids, (unsigned long long)conv, (unsigned long long)snap,
                            (unsigned long long)file_len);
    return EPYQ_OK;
}

static epyq_status check_id(const char *path, const uint8_t *h, const epyq_session_id *want,
                            epyq_err *err) {
    uint64_t mid = get64(h + 16);
    int32_t kv = (int32_t)get32(h + 24), ctx = (int32_t)get32(h + 28);
    if (mid != want->model_id)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "%s: model identity: expected %016llx (the loaded model), found "
                            "%016llx (saved with another checkpoint or --requant)",
                            path, (unsigned long long)want->model_id, (unsigned long long)mid);
    if (kv != want->kv_type)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "%s: KV type: expected %s (this run's --kv-type), found %s", path,
                            kv_name(want->kv_type), kv_name(kv));
    if (ctx != want->n_ctx)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "%s: context: expected %d (this run's -c), found %d (run with -c %d)",
                            path, want->n_ctx, ctx, ctx);
    return EPYQ_OK;
}

epyq_status epyq_session_read(const char *path, const epyq_session_id *want, epyq_session *out,
                              void **blob, epyq_err *err) {
    *blob = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return epyq_err_set(err, EPYQ_E_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    uint8_t h[HDR];
    epyq_status st = EPYQ_OK;
    if (fstat(fileno(f), &sb) || sb.st_size < 0)
        st = epyq_err_set(err, EPYQ_E_IO, "%s: %s", path, strerror(errno));
    else if ((uint64_t)sb.st_size < HDR || fread(h, 1, HDR, f) != HDR)
        st = epyq_err_set(err, EPYQ_E_FORMAT,
                          "%s: size: expected at least the %d-byte session header, found %lld "
                          "bytes (truncated or not a session)",
                          path, HDR, (long long)sb.st_size);
    if (st == EPYQ_OK) st = check_header(path, h, (uint64_t)sb.st_size, err);
    if (st == EPYQ_OK) st = check_id(path, h, want, err);
    uint64_t body = st == EPYQ_OK ? (uint64_t)sb.st_size - HDR : 0;
    uint8_t *b = NULL;
    if (st == EPYQ_OK && !(b = malloc(body ? (size_t)body : 1)))
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: a %llu-byte session: out of memory", path,
                          (unsigned long long)body);
    if (st == EPYQ_OK && body && fread(b, 1, (size_t)body, f) != body)
        st = epyq_err_set(err, EPYQ_E_IO, "%s: read failed (the file changed while read?)", path);
    fclose(f);
    if (st != EPYQ_OK) {
        free(b);
        return st;
    }
    epyq_session s = {.id = *want, .n_ids = (int32_t)get32(h + 32)};
    s.ids = (const int32_t *)b; /* malloc's alignment; ids come first */
    s.conv = (const char *)b + (size_t)s.n_ids * 4, s.conv_len = get64(h + 40);
    s.snap = s.conv + s.conv_len, s.snap_len = get64(h + 48);
    uint64_t want_sum = get64(h + 56), got = body_sum(&s);
    if (got != want_sum) {
        free(b);
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: body checksum: stored %016llx, computed %016llx (corrupt file)",
                            path, (unsigned long long)want_sum, (unsigned long long)got);
    }
    *out = s;
    *blob = b;
    return EPYQ_OK;
}
