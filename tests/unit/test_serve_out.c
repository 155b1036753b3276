/* tests/unit/test_serve_out.c — `epyq serve`'s response formatting (tools/serve_out.c) on model
 * output with reasoning and a Qwen tool call, cut into chunks at every split point:
 *   - non-streaming: reasoning_content, content, tool_calls (name, JSON arguments converted by
 *     the tool's schema), finish_reason "tool_calls", usage;
 *   - streaming: the deltas (reasoning_content, content, tool_calls) concatenate to the same
 *     message, the first chunk carries the role, the stream ends with the finish chunk, the
 *     usage chunk and [DONE];
 *   - stopping on length keeps finish_reason "length" even with a call. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check_main.h"
#include "tools/serve_out.h"

static const char *OUT =
    "<think>\nthe user wants weather</think>\n\nLet me look. <tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

static cJSON *tools(void) {
    return cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                       "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}}]");
}

static cJSON *message_of(const char *body) {
    cJSON *r = cJSON_Parse(body);
    ck_assert_ptr_nonnull(r);
    return r;
}

static void check_call(const cJSON *calls) {
    ck_assert_int_eq(cJSON_GetArraySize(calls), 1);
    const cJSON *f = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    ck_assert_str_eq(cJSON_GetObjectItem(f, "name")->valuestring, "get_weather");
    cJSON *args = cJSON_Parse(cJSON_GetObjectItem(f, "arguments")->valuestring);
    ck_assert_str_eq(cJSON_GetObjectItem(args, "city")->valuestring, "Paris");
    ck_assert(cJSON_GetObjectItem(args, "days")->valuedouble == 3);
    cJSON_Delete(args);
}

START_TEST(test_split_points) {
    size_t n = strlen(OUT), cut = (size_t)_i % n;
    cJSON *t = tools();
    const epyq_engine_usage u = {12, 40, 0};
    epyq_err err = {0};
    /* non-streaming, output pushed in two pieces cut at `cut` */
    epyq_serve_out o;
    ck_assert(epyq_serve_out_init(&o, true, false, "m", NULL, t, -1, false, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_push(&o, OUT, cut, NULL, NULL, 0, NULL, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_push(&o, OUT + cut, n - cut, NULL, NULL, 0, NULL, &err) == EPYQ_OK);
    char *body = NULL;
    ck_assert(epyq_serve_out_finish(&o, EPYQ_ENGINE_STOP, &u, false, NULL, &body, &err) == EPYQ_OK);
    epyq_serve_out_free(&o);
    cJSON *r = message_of(body);
    free(body);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), *m = cJSON_GetObjectItem(ch, "message");
    ck_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "tool_calls");
    ck_assert_str_eq(cJSON_GetObjectItem(m, "reasoning_content")->valuestring, "\nthe user wants weather");
    ck_assert_str_eq(cJSON_GetObjectItem(m, "content")->valuestring, "\n\nLet me look. ");
    check_call(cJSON_GetObjectItem(m, "tool_calls"));
    ck_assert_int_eq((int)cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "total_tokens")->valuedouble, 52);

    /* streaming, one byte at a time from `cut` on */
    epyq_sbuf sse = {0};
    ck_assert(epyq_serve_out_init(&o, true, true, "m", NULL, t, -1, false, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_start(&o, &sse, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_push(&o, OUT, cut, NULL, NULL, 0, &sse, &err) == EPYQ_OK);
    for (size_t i = cut; i < n; i++) ck_assert(epyq_serve_out_push(&o, OUT + i, 1, NULL, NULL, 0, &sse, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_finish(&o, EPYQ_ENGINE_STOP, &u, true, &sse, NULL, &err) == EPYQ_OK);
    epyq_serve_out_free(&o);
    epyq_sbuf rs = {0}, cs = {0};
    cJSON *calls = cJSON_CreateArray();
    int n_chunks = 0;
    const char *fin = NULL;
    bool role = false, usage = false, done = false;
    for (char *p = sse.p, *e; p && *p; p = e + 2) {
        e = strstr(p, "\n\n");
        ck_assert_ptr_nonnull(e);
        *e = '\0';
        ck_assert(!strncmp(p, "data: ", 6));
        ck_assert(!done); /* nothing after [DONE] */
        if (!strcmp(p + 6, "[DONE]")) {
            done = true;
            continue;
        }
        cJSON *c = cJSON_Parse(p + 6);
        ck_assert_ptr_nonnull(c);
        ck_assert_str_eq(cJSON_GetObjectItem(c, "object")->valuestring, "chat.completion.chunk");
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0), *d = cJSON_GetObjectItem(c0, "delta");
        if (n_chunks++ == 0) role = !strcmp(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
        if (cJSON_GetObjectItem(c, "usage")) usage = true;
        const cJSON *x;
        if ((x = cJSON_GetObjectItem(d, "reasoning_content"))) epyq_sbuf_adds(&rs, x->valuestring);
        if ((x = cJSON_GetObjectItem(d, "content"))) epyq_sbuf_adds(&cs, x->valuestring);
        if ((x = cJSON_GetObjectItem(d, "tool_calls")))
            for (const cJSON *k = x->child; k; k = k->next) {
                ck_assert_int_eq((int)cJSON_GetObjectItem(k, "index")->valuedouble, cJSON_GetArraySize(calls));
                cJSON_AddItemToArray(calls, cJSON_Duplicate(k, 1));
            }
        if ((x = cJSON_GetObjectItem(c0, "finish_reason")) && cJSON_IsString(x)) fin = strdup(x->valuestring);
        cJSON_Delete(c);
    }
    ck_assert(role && usage && done);
    ck_assert_str_eq(fin, "tool_calls");
    ck_assert_str_eq(rs.p, "\nthe user wants weather");
    ck_assert_str_eq(cs.p, "\n\nLet me look. ");
    check_call(calls);
    free((char *)fin);
    cJSON_Delete(calls);
    epyq_sbuf_free(&rs), epyq_sbuf_free(&cs), epyq_sbuf_free(&sse);
    cJSON_Delete(r);
    cJSON_Delete(t);
}
END_TEST

START_TEST(test_length_and_plain) {
    cJSON *t = tools();
    const epyq_engine_usage u = {3, 5, 0};
    epyq_err err = {0};
    epyq_serve_out o;
    char *body = NULL;
    ck_assert(epyq_serve_out_init(&o, true, false, "m", NULL, t, -1, true, &err) == EPYQ_OK); /* prompt opened <think> */
    ck_assert(epyq_serve_out_push(&o, OUT + 7, strlen(OUT) - 7, NULL, NULL, 0, NULL, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_finish(&o, EPYQ_ENGINE_LENGTH, &u, false, NULL, &body, &err) == EPYQ_OK);
    epyq_serve_out_free(&o);
    cJSON *r = message_of(body);
    free(body);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "length");
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "reasoning_content")->valuestring, "\nthe user wants weather");
    cJSON_Delete(r);
    /* without tools the call stays text; completions carry text only */
    ck_assert(epyq_serve_out_init(&o, true, false, "m", NULL, NULL, -1, false, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_push(&o, "plain <tool_call>x", 18, NULL, NULL, 0, NULL, &err) == EPYQ_OK);
    ck_assert(epyq_serve_out_finish(&o, EPYQ_ENGINE_STOP, &u, false, NULL, &body, &err) == EPYQ_OK);
    epyq_serve_out_free(&o);
    r = message_of(body);
    free(body);
    ch = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content")->valuestring, "plain <tool_call>x");
    ck_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
    ck_assert_ptr_null(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "tool_calls"));
    cJSON_Delete(r);
    cJSON_Delete(t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("serve_out");
    TCase *tc = epyq_test_case(s, "serve_out", 0);
    tcase_add_loop_test(tc, test_split_points, 0, (int)strlen(OUT));
    tcase_add_test(tc, test_length_and_plain);
    return epyq_test_run(s);
}
