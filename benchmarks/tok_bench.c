/* benchmarks/tok_bench.c — tokenizer throughput on one core.
 *
 *   tok_bench [-m DIR] [--mb N]
 *
 * DIR (default $EPYQ_SHARED/fixtures/tokenizer, else ../shared next to the source tree) holds
 * tokenizer.json. Prints the load time, then encode MB/s and tokens/s, with and without the
 * per-word BPE cache, over (1) the golden corpus, one call per line, and (2) a ~N MB (default
 * 10) English + code text built deterministically from the corpus's English/code/model-card
 * lines and this repository's own source files, shuffled in paragraph-sized chunks by a fixed
 * seed and encoded in 64 KiB calls; and decode MB/s over the resulting ids. Rates are given by
 * wall time and by this thread's CPU time (the honest figure on a shared, busy machine). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/util.h"
#include "tok/json_text.h"
#include "tok/sbuf.h"
#include "tok/tokenizer.h"

#ifndef EPYQ_BENCH_SRCDIR
#define EPYQ_BENCH_SRCDIR "."
#endif

typedef struct {
    char **text;   /* [n] */
    size_t *len;   /* [n] */
    size_t n, cap, bytes;
} texts;

static void texts_add(texts *t, const char *s, size_t n) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->text = realloc(t->text, t->cap * sizeof *t->text);
        t->len = realloc(t->len, t->cap * sizeof *t->len);
        if (!t->text || !t->len) exit(1);
    }
    t->text[t->n] = malloc(n + 1);
    memcpy(t->text[t->n], s, n);
    t->text[t->n][n] = '\0';
    t->len[t->n++] = n;
    t->bytes += n;
}

/* golden_encode.jsonl texts; prose_code receives the English / code / model-card ones. */
static void read_golden(const char *dir, texts *all, texts *prose_code) {
    char *path = epyq_path_join(dir, "golden_encode.jsonl"), *buf;
    size_t len;
    epyq_err err;
    if (epyq_file_read(path, 64u << 20, &buf, &len, &err) != EPYQ_OK) {
        fprintf(stderr, "tok_bench: %s\n", err.msg);
        exit(1);
    }
    for (char *p = buf; p < buf + len;) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(buf + len - p);
        char *text, *cat;
        size_t tl, cl;
        bool found, fcat;
        if (l && epyq_json_text_field(p, l, "text", &text, &tl, &found, &err) == EPYQ_OK && found) {
            texts_add(all, text, tl);
            if (epyq_json_text_field(p, l, "category", &cat, &cl, &fcat, &err) == EPYQ_OK && fcat) {
                if (!strcmp(cat, "english") || !strcmp(cat, "code") || !strcmp(cat, "model_card") || !strcmp(cat, "long"))
                    texts_add(prose_code, text, tl);
                free(cat);
            }
            free(text);
        }
        p += l + 1;
    }
    free(buf);
    free(path);
}

/* Every .c/.h/.md/.am file under dir (one level of recursion per call), as blank-line
 * separated paragraphs: realistic code and prose without shipping a corpus. */
static void read_sources(const char *dir, int depth, texts *out) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *p = epyq_path_join(dir, e->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode) && depth < 3) {
            read_sources(p, depth + 1, out);
        } else if (S_ISREG(sb.st_mode)) {
            const char *dot = strrchr(e->d_name, '.');
            if (dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".md") || !strcmp(dot, ".am"))) {
                char *buf;
                size_t len;
                epyq_err err;
                if (epyq_file_read(p, 8u << 20, &buf, &len, &err) == EPYQ_OK) {
                    for (char *q = buf; q < buf + len;) {
                        char *end = strstr(q, "\n\n");
                        size_t l = end ? (size_t)(end - q) + 2 : (size_t)(buf + len - q);
                        texts_add(out, q, l);
                        q += l;
                    }
                    free(buf);
                }
            }
        }
        free(p);
    }
    closedir(d);
}

static uint64_t rng(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Paragraphs drawn in a seeded random order until target bytes. */
static char *build_mix(const texts *a, const texts *b, size_t target, size_t *len) {
    epyq_sbuf s = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    while (s.len < target) {
        const texts *src = (rng(&x) % 4 == 0 || !b->n) ? a : b;
        size_t i = rng(&x) % src->n;
        epyq_sbuf_add(&s, src->text[i], src->len[i]);
        epyq_sbuf_addc(&s, '\n');
    }
    return epyq_sbuf_take(&s, len);
}

/* CPU time of this thread: on a busy machine wall time mostly measures the other processes. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    double mbps, cpu_mbps, tokps;
    size_t tokens;
} rate;

/* Encode the texts repeatedly for at least min_s seconds. */
static rate bench_texts(const epyq_tok *t, const texts *tx, double min_s) {
    size_t bytes = 0, toks = 0, rounds = 0;
    double t0 = epyq_now(), c0 = cpu_now(), el;
    do {
        for (size_t i = 0; i < tx->n; i++) {
            int32_t *ids;
            size_t n;
            epyq_err err;
            if (epyq_tok_encode(t, tx->text[i], tx->len[i], &ids, &n, &err) != EPYQ_OK) {
                fprintf(stderr, "tok_bench: %s\n", err.msg);
                exit(1);
            }
            toks += n;
            free(ids);
        }
        bytes += tx->bytes;
        rounds++;
    } while ((el = epyq_now() - t0) < min_s);
    double cpu = cpu_now() - c0;
    return (rate){bytes / el / 1e6, bytes / cpu / 1e6, toks / cpu, toks / rounds};
}

static epyq_tok *load(const char *dir, size_t cache, double *ms) {
    epyq_tok_opts o = epyq_tok_opts_default();
    o.word_cache_entries = cache;
    epyq_tok *t;
    epyq_err err;
    double t0 = epyq_now();
    if (epyq_tok_load_opts(&t, dir, &o, &err) != EPYQ_OK) {
        fprintf(stderr, "tok_bench: %s\n", err.msg);
        exit(1);
    }
    if (ms) *ms = (epyq_now() - t0) * 1e3;
    return t;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    double mb = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: tok_bench [-m DIR] [--mb N]\n");
            return 2;
        }
    }
    char fallback[4096];
    if (!dir) {
        const char *sh = getenv("EPYQ_SHARED");
        snprintf(fallback, sizeof fallback, "%s/fixtures/tokenizer", sh && *sh ? sh : EPYQ_BENCH_SRCDIR "/../shared");
        dir = fallback;
    }
    double load_ms;
    epyq_tok *cached = load(dir, 65536, &load_ms), *plain = load(dir, 0, NULL);
    texts golden = {0}, prose = {0}, src = {0};
    read_golden(dir, &golden, &prose);
    read_sources(EPYQ_BENCH_SRCDIR, 0, &src);
    size_t mix_len;
    char *mix = build_mix(&prose, &src, (size_t)(mb * 1e6), &mix_len);
    texts chunks = {0};
    for (size_t off = 0; off < mix_len; off += 65536) texts_add(&chunks, mix + off, mix_len - off < 65536 ? mix_len - off : 65536);

    printf("tokenizer: %s (vocab %d), load %.0f ms\n", dir, epyq_tok_vocab_size(cached), load_ms);
    printf("%-34s %8s %6s %10s %10s %12s\n", "corpus", "MB", "cache", "MB/s wall", "MB/s cpu", "tokens/s cpu");
    const struct {
        const char *name;
        const texts *tx;
    } sets[] = {{"golden corpus (398 lines)", &golden}, {"English+code mix (64 KiB calls)", &chunks}};
    for (size_t s = 0; s < 2; s++)
        for (int c = 1; c >= 0; c--) {
            rate r = bench_texts(c ? cached : plain, sets[s].tx, 1.0);
            printf("%-34s %8.2f %6s %10.1f %10.1f %12.0f\n", sets[s].name, sets[s].tx->bytes / 1e6, c ? "on" : "off", r.mbps,
                   r.cpu_mbps, r.tokps);
        }

    /* Decode of the mix's ids: one-shot, and streamed token by token as the REPL does. */
    int32_t *ids;
    size_t n;
    epyq_err err;
    if (epyq_tok_encode(cached, mix, mix_len, &ids, &n, &err) != EPYQ_OK) {
        fprintf(stderr, "tok_bench: %s\n", err.msg);
        return 1;
    }
    double t0 = cpu_now();
    char *out;
    size_t ol;
    if (epyq_tok_decode(cached, ids, n, false, &out, &ol, &err) != EPYQ_OK) return 1;
    double one = cpu_now() - t0;
    free(out);
    epyq_tok_stream *st = epyq_tok_stream_new(cached, false);
    t0 = cpu_now();
    for (size_t i = 0; i < n; i++) {
        if (epyq_tok_stream_push(st, ids[i], &out, &err) != EPYQ_OK) return 1;
        free(out);
    }
    double streamed = cpu_now() - t0;
    epyq_tok_stream_free(st);
    printf("decode %zu ids (%.2f MB, CPU time): one-shot %.1f MB/s, streaming %.0f ns/token\n", n, mix_len / 1e6, mix_len / one / 1e6,
           streamed / (double)n * 1e9);
    printf("one whole-text call on the %.2f MB mix: %zu tokens (%.2f bytes/token)\n", mix_len / 1e6, n, (double)mix_len / (double)n);
    free(ids);
    free(mix);
    epyq_tok_free(cached);
    epyq_tok_free(plain);
    return 0;
}
