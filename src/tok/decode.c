/* src/tok/decode.c — ids -> text, one-shot and streaming.
 *
 * The reference concatenates every kept token's ByteLevel bytes and runs one lossy UTF-8
 * conversion over the whole byte string; ids with no token are dropped silently and
 * skip_special drops the special=true added tokens. The stream does the same conversion
 * incrementally: bytes are converted as soon as they cannot be the start of a still-valid
 * sequence, and the (at most 3-byte) incomplete tail waits for the next token. Because the
 * lossy rule only looks ahead within one sequence, the concatenated stream output equals the
 * one-shot result. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"

static bool keep(const epyq_tok *t, int32_t id, bool skip_special) {
    return id >= 0 && id < t->n_ids && !(skip_special && t->is_special[id]);
}

epyq_status epyq_tok_decode(const epyq_tok *t, const int32_t *ids, size_t n, bool skip_special, char **out,
                            size_t *out_len, epyq_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    epyq_sbuf bytes = {0}, text = {0};
    for (size_t i = 0; i < n; i++) {
        if (!keep(t, ids[i], skip_special)) continue;
        uint32_t a = t->dec_off[ids[i]], b = t->dec_off[ids[i] + 1];
        if (!epyq_sbuf_add(&bytes, t->dec + a, b - a)) goto nomem;
    }
    if (epyq_tok_utf8_lossy((const uint8_t *)bytes.p, bytes.len, true, &text) == SIZE_MAX) goto nomem;
    epyq_sbuf_free(&bytes);
    *out = epyq_sbuf_take(&text, out_len);
    return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
nomem:
    epyq_sbuf_free(&bytes);
    epyq_sbuf_free(&text);
    return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
}

struct epyq_tok_stream {
    const epyq_tok *t;
    bool skip_special;
    uint8_t tail[8];  /* [tail_len] bytes of an incomplete UTF-8 sequence (at most 3 are kept) */
    size_t tail_len;
};

epyq_tok_stream *epyq_tok_stream_new(const epyq_tok *t, bool skip_special) {
    epyq_tok_stream *s = calloc(1, sizeof *s);
    if (s) {
        s->t = t;
        s->skip_special = skip_special;
    }
    return s;
}

void epyq_tok_stream_free(epyq_tok_stream *s) { free(s); }

/* Convert tail + more; keep the new incomplete tail. */
static epyq_status stream_emit(epyq_tok_stream *s, const uint8_t *more, size_t n, bool final, char **out,
                               size_t *out_len, epyq_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    epyq_sbuf bytes = {0}, text = {0};
    if (!epyq_sbuf_add(&bytes, s->tail, s->tail_len) || !epyq_sbuf_add(&bytes, more, n)) goto nomem;
    size_t used = epyq_tok_utf8_lossy((const uint8_t *)bytes.p, bytes.len, final, &text);
    if (used == SIZE_MAX) goto nomem;
    /* Only a valid-so-far prefix of one sequence is ever held back: under 4 bytes. */
    s->tail_len = bytes.len - used;
    memcpy(s->tail, bytes.p + used, s->tail_len);
    epyq_sbuf_free(&bytes);
    *out = epyq_sbuf_take(&text, out_len);
    return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory in the stream decoder");
nomem:
    epyq_sbuf_free(&bytes);
    epyq_sbuf_free(&text);
    return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory in the stream decoder");
}

epyq_status epyq_tok_stream_push_n(epyq_tok_stream *s, int32_t id, char **out, size_t *out_len, epyq_err *err) {
    const epyq_tok *t = s->t;
    if (!keep(t, id, s->skip_special)) return stream_emit(s, NULL, 0, false, out, out_len, err);
    uint32_t a = t->dec_off[id], b = t->dec_off[id + 1];
    return stream_emit(s, t->dec + a, b - a, false, out, out_len, err);
}

epyq_status epyq_tok_stream_finish_n(epyq_tok_stream *s, char **out, size_t *out_len, epyq_err *err) {
    return stream_emit(s, NULL, 0, true, out, out_len, err);
}

epyq_status epyq_tok_stream_push(epyq_tok_stream *s, int32_t id, char **out, epyq_err *err) {
    return epyq_tok_stream_push_n(s, id, out, NULL, err);
}

epyq_status epyq_tok_stream_finish(epyq_tok_stream *s, char **out, epyq_err *err) {
    return epyq_tok_stream_finish_n(s, out, NULL, err);
}
