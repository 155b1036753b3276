/* tests/unit/test_parse.c — splitting model output into reasoning, answer and tool calls.
 * Expected values follow vLLM's qwen3 reasoning parser and qwen3_coder tool parser rules
 * (written out by hand). Every case is also pushed cut at every byte position, and one byte
 * at a time, and must give the same result as one chunk. No ../shared needed. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/reasoning.h"
#include "chat/toolcall.h"
#include "tests/check_main.h"
#include "tok/sbuf.h"

/* ---- reasoning -------------------------------------------------------------------------- */

typedef struct {
    const char *text;
    bool starts_in_reasoning;
    const char *reasoning, *content;
} rcase;

static const rcase RCASES[] = {
    {"Let me think.\n</think>\n\nThe answer is 4.", true, "Let me think.\n", "\n\nThe answer is 4."},
    {"<think>\nhmm\n</think>\n\nok", false, "\nhmm\n", "\n\nok"},
    {"plain answer", false, "", "plain answer"},
    {"<think>dup</think>x", true, "dup", "x"},
    {"unfinished reasoning <", true, "unfinished reasoning <", ""},
    {"a </think> b </think> c", true, "a ", " b </think> c"},
    {"<thin", false, "", "<thin"},
    {"<think", true, "<think", ""},
    {"x<think>y</think>z", false, "", "x<think>y</think>z"},
    {"", true, "", ""},
    {"</think>", true, "", ""},
    {"caf\xc3\xa9 </thi", true, "caf\xc3\xa9 </thi", ""},
};

/* Pushes text cut at the given positions (cuts[] ascending, n_cuts of them). */
static void run_reasoning(const rcase *c, const size_t *cuts, size_t n_cuts, epyq_sbuf *r, epyq_sbuf *a) {
    epyq_reasoning *p = epyq_reasoning_new(c->starts_in_reasoning);
    ck_assert_ptr_nonnull(p);
    size_t len = strlen(c->text), prev = 0;
    epyq_err err = {0};
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        ck_assert(epyq_reasoning_push(p, c->text + prev, end - prev, r, a, &err) == EPYQ_OK);
        prev = end;
    }
    ck_assert(epyq_reasoning_finish(p, r, a, &err) == EPYQ_OK);
    epyq_reasoning_free(p);
}

static void expect_reasoning(const rcase *c, const size_t *cuts, size_t n_cuts) {
    epyq_sbuf r = {0}, a = {0};
    run_reasoning(c, cuts, n_cuts, &r, &a);
    const char *gr = r.p ? r.p : "", *ga = a.p ? a.p : "";
    ck_assert_msg(!strcmp(gr, c->reasoning) && !strcmp(ga, c->content),
                  "[%s] (cuts %zu, first %zu): reasoning [%s] content [%s], want [%s] [%s]", c->text, n_cuts,
                  n_cuts ? cuts[0] : 0, gr, ga, c->reasoning, c->content);
    epyq_sbuf_free(&r);
    epyq_sbuf_free(&a);
}

START_TEST(reasoning_every_split) {
    for (size_t k = 0; k < sizeof RCASES / sizeof RCASES[0]; k++) {
        const rcase *c = &RCASES[k];
        size_t len = strlen(c->text);
        expect_reasoning(c, NULL, 0);
        for (size_t cut = 0; cut <= len; cut++) expect_reasoning(c, &cut, 1);
        size_t *all = malloc((len + 1) * sizeof *all);
        for (size_t i = 0; i < len; i++) all[i] = i + 1;
        expect_reasoning(c, all, len ? len - 1 : 0); /* one byte at a time */
        free(all);
    }
}
END_TEST

/* ---- tool calls ------------------------------------------------------------------------- */

typedef struct {
    const char *text;
    const char *tools;   /* JSON or NULL */
    const char *content; /* expected answer text */
    const char *calls;   /* expected calls as compact JSON (cJSON_PrintUnformatted) */
} tcase;

static const char WEATHER_TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"temp\":{\"type\":\"number\"},"
    "\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":\"array\"}}}}}]";

static const tcase TCASES[] = {
    {"Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
     "</parameter>\n</function>\n</tool_call>",
     WEATHER_TOOLS, "Sure.\n\n", "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}]"},
    /* Typed values: number (integral -> int), boolean, object (JSON), array as a Python literal. */
    {"<tool_call>\n<function=get_weather>\n<parameter=temp>\n21.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
     "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n['x', \"y\", None]\n</parameter>\n"
     "<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
     WEATHER_TOOLS, "",
     "[{\"name\":\"get_weather\",\"arguments\":{\"temp\":21.5,\"metric\":true,\"opts\":{\"a\":[1,2]},"
     "\"tags\":[\"x\",\"y\",null],\"days\":\"three\"}}]"},
    /* Two calls; multi-line value; text between and after calls is dropped. */
    {"<tool_call>\n<function=f>\n<parameter=text>\nline1\nline2\n</parameter>\n</function>\n</tool_call>\nbetween\n"
     "<tool_call>\n<function=g>\n</function>\n</tool_call>trailing",
     NULL, "", "[{\"name\":\"f\",\"arguments\":{\"text\":\"line1\\nline2\"}},{\"name\":\"g\",\"arguments\":{}}]"},
    /* Without a schema every value is a string, except null (any case). */
    {"<tool_call>\n<function=h>\n<parameter=x>\n42\n</parameter>\n<parameter=y>\nNULL\n</parameter>\n</function>\n</tool_call>",
     NULL, "", "[{\"name\":\"h\",\"arguments\":{\"x\":\"42\",\"y\":null}}]"},
    /* Not a tool call after all: everything is content (vLLM's fallback). */
    {"I will use <tool_call> later.", NULL, "I will use <tool_call> later.", "[]"},
    {"no calls here <tool", NULL, "no calls here <tool", "[]"},
    /* </tool_call> closes a function left open; a parameter left open ends at the function end. */
    {"<tool_call>\n<function=get_weather>\n<parameter=days>\n1\n</tool_call>", WEATHER_TOOLS, "",
     "[{\"name\":\"get_weather\",\"arguments\":{\"days\":1}}]"},
    /* Truncated output: the open call is completed at the end. */
    {"ok <tool_call>\n<function=f>\n<parameter=a>\nx", NULL, "ok ", "[{\"name\":\"f\",\"arguments\":{\"a\":\"x\"}}]"},
    /* A bare <function= without <tool_call>; the next <parameter= ends a value; repeated names keep the last value. */
    {"<function=f><parameter=a>1<parameter=b>2<parameter=a>3</function>", NULL, "",
     "[{\"name\":\"f\",\"arguments\":{\"a\":\"3\",\"b\":\"2\"}}]"},
    {"caf\xc3\xa9 <tool_call><function=\xc3\xa9t\xc3\xa9><parameter=p>\xe2\x82\xac</parameter></function></tool_call>", NULL,
     "caf\xc3\xa9 ", "[{\"name\":\"\xc3\xa9t\xc3\xa9\",\"arguments\":{\"p\":\"\xe2\x82\xac\"}}]"},
};

static char *run_toolcall(const tcase *c, const size_t *cuts, size_t n_cuts, epyq_sbuf *content) {
    cJSON *tools = c->tools ? cJSON_Parse(c->tools) : NULL;
    ck_assert(!c->tools || tools);
    epyq_toolcall_parser *p = epyq_toolcall_new(tools);
    cJSON *calls = cJSON_CreateArray();
    size_t len = strlen(c->text), prev = 0;
    epyq_err err = {0};
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        ck_assert(epyq_toolcall_push(p, c->text + prev, end - prev, content, calls, &err) == EPYQ_OK);
        prev = end;
    }
    ck_assert(epyq_toolcall_finish(p, content, calls, &err) == EPYQ_OK);
    char *s = cJSON_PrintUnformatted(calls);
    cJSON_Delete(calls);
    epyq_toolcall_free(p);
    cJSON_Delete(tools);
    return s;
}

static void expect_toolcall(const tcase *c, const size_t *cuts, size_t n_cuts) {
    epyq_sbuf content = {0};
    char *calls = run_toolcall(c, cuts, n_cuts, &content);
    const char *got = content.p ? content.p : "";
    ck_assert_msg(!strcmp(got, c->content) && !strcmp(calls, c->calls),
                  "[%s] (cuts %zu, first %zu):\n content [%s] want [%s]\n calls %s\n want  %s", c->text, n_cuts,
                  n_cuts ? cuts[0] : 0, got, c->content, calls, c->calls);
    free(calls);
    epyq_sbuf_free(&content);
}

START_TEST(toolcall_every_split) {
    for (size_t k = 0; k < sizeof TCASES / sizeof TCASES[0]; k++) {
        const tcase *c = &TCASES[k];
        size_t len = strlen(c->text);
        expect_toolcall(c, NULL, 0);
        for (size_t cut = 0; cut <= len; cut++) expect_toolcall(c, &cut, 1);
        size_t *all = malloc((len + 1) * sizeof *all);
        for (size_t i = 0; i < len; i++) all[i] = i + 1;
        expect_toolcall(c, all, len ? len - 1 : 0);
        free(all);
    }
}
END_TEST

static void expect_convert(const char *value, const char *schema, const char *want) {
    cJSON *s = schema ? cJSON_Parse(schema) : NULL;
    cJSON *v = epyq_toolcall_convert(value, strlen(value), s);
    char *got = cJSON_PrintUnformatted(v);
    ck_assert_msg(!strcmp(got, want), "convert [%s] as %s: %s, want %s", value, schema ? schema : "(none)", got, want);
    free(got);
    cJSON_Delete(v);
    cJSON_Delete(s);
}

START_TEST(value_conversion) {
    const char *INT = "{\"type\":\"integer\"}", *NUM = "{\"type\":\"number\"}", *BOOL = "{\"type\":\"boolean\"}";
    const char *ARR = "{\"type\":\"array\"}", *STR = "{\"type\":\"string\"}", *ANY = "{\"type\":[\"string\",\"null\"]}";
    expect_convert(" 7 ", INT, "7");
    expect_convert("1_000", INT, "1000");
    expect_convert("3.0", INT, "\"3.0\"");  /* Python int("3.0") fails */
    expect_convert("3.0", NUM, "3");        /* integral floats become ints */
    expect_convert("2.5e1", NUM, "25");
    expect_convert("-0.25", NUM, "-0.25");
    expect_convert("inf", NUM, "\"inf\"");  /* int(inf) fails in vLLM: stays a string */
    expect_convert("0x10", NUM, "\"0x10\"");
    expect_convert("TRUE", BOOL, "true");
    expect_convert("yes", BOOL, "false");
    expect_convert("[1, 'a', (2, 3)]", ARR, "[1,\"a\",[2,3]]"); /* not JSON: Python literal */
    expect_convert("[1, 2", ARR, "\"[1, 2\"");
    expect_convert("null", STR, "null");
    expect_convert("{\"k\": 1}", STR, "\"{\\\"k\\\": 1}\"");
    expect_convert("{'k': True}", ANY, "{\"k\":true}");  /* unknown type: literal_eval */
    expect_convert("hello", ANY, "\"hello\"");
    expect_convert("12", NULL, "\"12\"");
    expect_convert("{\"a\": 1} junk", "{\"type\":\"object\"}", "\"{\\\"a\\\": 1} junk\"");
}
END_TEST

START_TEST(arguments_json_text) {
    /* vLLM returns arguments as json.dumps(..., ensure_ascii=False). */
    cJSON *call = cJSON_Parse("{\"name\":\"f\",\"arguments\":{\"city\":\"Z\xc3\xbcrich\",\"n\":3,\"x\":2.5,\"l\":[true,null],\"q\":\"a\\\"b\\n\"}}");
    char *s = epyq_toolcall_arguments_json(call);
    ck_assert_str_eq(s, "{\"city\": \"Z\xc3\xbcrich\", \"n\": 3, \"x\": 2.5, \"l\": [true, null], \"q\": \"a\\\"b\\n\"}");
    free(s);
    cJSON_Delete(call);
}
END_TEST

START_TEST(reasoning_then_tools) {
    /* The serving pipeline: reasoning first, then tool calls parsed from the answer only. */
    const char *out = "I should call it. <tool_call> is the tag.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                      "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
    epyq_reasoning *rp = epyq_reasoning_new(true);
    epyq_sbuf r = {0}, a = {0}, content = {0};
    epyq_err err = {0};
    for (const char *p = out; *p; p += 3) {
        size_t n = strlen(p) < 3 ? strlen(p) : 3;
        ck_assert(epyq_reasoning_push(rp, p, n, &r, &a, &err) == EPYQ_OK);
        if (strlen(p) < 3) break;
    }
    ck_assert(epyq_reasoning_finish(rp, &r, &a, &err) == EPYQ_OK);
    ck_assert_str_eq(r.p, "I should call it. <tool_call> is the tag.\n");
    cJSON *tools = cJSON_Parse(WEATHER_TOOLS), *calls = cJSON_CreateArray();
    epyq_toolcall_parser *tp = epyq_toolcall_new(tools);
    ck_assert(epyq_toolcall_push(tp, a.p, a.len, &content, calls, &err) == EPYQ_OK);
    ck_assert(epyq_toolcall_finish(tp, &content, calls, &err) == EPYQ_OK);
    ck_assert_str_eq(content.p, "\n\n");
    char *s = cJSON_PrintUnformatted(calls);
    ck_assert_str_eq(s, "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}]");
    free(s);
    cJSON_Delete(calls);
    cJSON_Delete(tools);
    epyq_toolcall_free(tp);
    epyq_reasoning_free(rp);
    epyq_sbuf_free(&r);
    epyq_sbuf_free(&a);
    epyq_sbuf_free(&content);
}
END_TEST

int main(void) {
    Suite *s = suite_create("parse");
    TCase *tc = epyq_test_case(s, "parse", 120);
    EPYQ_TESTS_ADD(tc, reasoning_every_split, toolcall_every_split, value_conversion,
                   arguments_json_text, reasoning_then_tools);
    return epyq_test_run(s);
}
