/* src/chat/reasoning.c — see reasoning.h. Held-back text lives in `pending`: it is at most
 * one tag long, so the parser's memory stays constant whatever the output length. */
#include "chat/reasoning.h"

#include <stdlib.h>
#include <string.h>

static const char OPEN[] = "<think>";
static const char CLOSE[] = "</think>";

typedef enum { AT_START, IN_REASONING, IN_CONTENT } rstate;

struct epyq_reasoning {
    rstate state;
    bool start_reasoning; /* where text goes if the output does not open with <think> */
    epyq_sbuf pending;    /* bytes not yet assigned (possible start of a tag) */
};

size_t epyq_tag_partial_suffix(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

epyq_reasoning *epyq_reasoning_new(bool starts_in_reasoning) {
    epyq_reasoning *p = calloc(1, sizeof *p);
    if (p) p->start_reasoning = starts_in_reasoning;
    return p;
}

static epyq_status out_of_memory(epyq_err *err) {
    return epyq_err_set(err, EPYQ_E_NOMEM, "reasoning parser: out of memory");
}

/* Consumes as much of pending as can be decided now. */
static bool drain(epyq_reasoning *p, epyq_sbuf *reasoning, epyq_sbuf *content, bool final) {
    epyq_sbuf *pend = &p->pending;
    size_t used = 0;
    bool ok = true;
    for (;;) {
        const char *s = pend->p + used;
        size_t n = pend->len - used;
        if (p->state == AT_START) {
            size_t m = n < sizeof OPEN - 1 ? n : sizeof OPEN - 1;
            if (memcmp(s, OPEN, m) != 0 || (final && n < sizeof OPEN - 1)) {
                p->state = p->start_reasoning ? IN_REASONING : IN_CONTENT;
                continue;
            }
            if (n < sizeof OPEN - 1) break; /* could still become <think> */
            used += sizeof OPEN - 1;
            p->state = IN_REASONING;
            continue;
        }
        if (p->state == IN_CONTENT) {
            ok = epyq_sbuf_add(content, s, n);
            used += n;
            break;
        }
        const char *end = n ? memmem(s, n, CLOSE, sizeof CLOSE - 1) : NULL;
        if (end) {
            ok = epyq_sbuf_add(reasoning, s, (size_t)(end - s));
            used += (size_t)(end - s) + sizeof CLOSE - 1;
            p->state = IN_CONTENT;
            if (!ok) break;
            continue;
        }
        size_t keep = final ? 0 : epyq_tag_partial_suffix(s, n, CLOSE);
        ok = epyq_sbuf_add(reasoning, s, n - keep);
        used += n - keep;
        break;
    }
    memmove(pend->p, pend->p + used, pend->len - used);
    pend->len -= used;
    pend->p[pend->len] = '\0';
    return ok;
}

epyq_status epyq_reasoning_push(epyq_reasoning *p, const char *text, size_t len,
                                epyq_sbuf *reasoning, epyq_sbuf *content, epyq_err *err) {
    if (!epyq_sbuf_add(&p->pending, text, len)) return out_of_memory(err);
    return drain(p, reasoning, content, false) ? EPYQ_OK : out_of_memory(err);
}

epyq_status epyq_reasoning_finish(epyq_reasoning *p, epyq_sbuf *reasoning, epyq_sbuf *content,
                                  epyq_err *err) {
    if (!epyq_sbuf_add(&p->pending, "", 0)) return out_of_memory(err);
    return drain(p, reasoning, content, true) ? EPYQ_OK : out_of_memory(err);
}

bool epyq_reasoning_active(const epyq_reasoning *p) {
    return p->state == IN_REASONING || (p->state == AT_START && p->start_reasoning);
}

void epyq_reasoning_free(epyq_reasoning *p) {
    if (!p) return;
    epyq_sbuf_free(&p->pending);
    free(p);
}
