/* tests/unit/model_greedy.h — the prompt-then-greedy-decode run that the NUMA model tests
 * compare across modes: the same rows from every mode means the same bits, decode steps
 * included (each step feeds the previous row's argmax, so one differing bit shows). */
#ifndef EPYQ_TESTS_MODEL_GREEDY_H
#define EPYQ_TESTS_MODEL_GREEDY_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* The prompt tok[0..n_prompt) on s, then n_decode greedy steps: logits into
 * lg[n_prompt + n_decode][V]. n_prompt is at most 16. */
static inline void epyq_test_greedy(epyq_model *m, epyq_seq *s, int32_t *tok, int n_prompt,
                                    int n_decode, int32_t V, float *lg) {
    epyq_err err = {0};
    epyq_seq *seqs[16];
    ck_assert_int_le(n_prompt, 16);
    for (int i = 0; i < n_prompt; i++) seqs[i] = s;
    epyq_batch b = {n_prompt, seqs, tok, NULL};
    ck_assert_msg(epyq_model_forward(m, &b, lg, NULL, &err) == EPYQ_OK, "%s", err.msg);
    for (int d = 0; d < n_decode; d++) {
        const float *prev = lg + (size_t)(n_prompt - 1 + d) * V;
        int32_t t = 0;
        for (int32_t i = 1; i < V; i++) t = prev[i] > prev[t] ? i : t;
        epyq_batch b1 = {1, seqs, &t, NULL};
        ck_assert_msg(epyq_model_forward(m, &b1, lg + (size_t)(n_prompt + d) * V, NULL, &err) ==
                          EPYQ_OK,
                      "%s", err.msg);
    }
}

#endif
