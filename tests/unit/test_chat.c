/* tests/unit/test_chat.c — rendering conversations with the real Qwen3.6 chat template.
 *  - ../shared fixtures (skipped when absent): every chat_cases.jsonl case byte-identical and
 *    its ids through the tokenizer, the rendered cases of real_qwen36_reference.jsonl, and
 *    `epyq template` (text, --ids, exit codes) on the fixture folder;
 *  - project-local: the copy of the real template that `epyq synth` embeds (when linked in),
 *    checked against prompts written out from the template's documented behaviour
 *    (src/chat/chat.h), and every raise_exception path of the template. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "chat/chat.h"
#include "core/util.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tok/sbuf.h"
#include "tok/tokenizer.h"

/* epyq synth's embedded copy of the real template (src/synth/tok_data.c). */
extern const char epyq_synth_chat_template[];

static char g_fixture_dir[4096];

static const char *fixture_dir(void) {
    const char *d = epyq_test_shared("fixtures/tokenizer");
    if (!d) return NULL;
    snprintf(g_fixture_dir, sizeof g_fixture_dir, "%s", d);
    return g_fixture_dir;
}

/* The real template: from ../shared when present, else synth's copy. */
static epyq_chat *real_chat(void) {
    epyq_chat *c = NULL;
    epyq_err err = {0};
    const char *dir = fixture_dir();
    if (dir) {
        ck_assert_msg(epyq_chat_load(&c, dir, &err) == EPYQ_OK, "%s", err.msg);
    } else {
        ck_assert_msg(epyq_chat_from_template(&c, epyq_synth_chat_template, strlen(epyq_synth_chat_template), &err) == EPYQ_OK,
                      "%s", err.msg);
    }
    return c;
}

static char *render_json(epyq_chat *c, const char *messages, const char *kwargs, epyq_err *err) {
    cJSON *m = cJSON_Parse(messages), *k = kwargs ? cJSON_Parse(kwargs) : NULL;
    ck_assert_msg(m && (!kwargs || k), "bad test JSON");
    char *out = NULL;
    size_t n = 0;
    epyq_status st = epyq_chat_render(c, m, k, &out, &n, err);
    cJSON_Delete(m);
    cJSON_Delete(k);
    return st == EPYQ_OK ? out : NULL;
}

#define EXPECT_CHAT(c, msgs, kw, want)                                                     \
    do {                                                                                   \
        epyq_err e_ = {0};                                                                 \
        char *o_ = render_json((c), (msgs), (kw), &e_);                                    \
        ck_assert_msg(o_ != NULL, "render failed: %s", e_.msg);                            \
        ck_assert_msg(!strcmp(o_, (want)), "\n got: [%s]\nwant: [%s]", o_, (want));        \
        free(o_);                                                                          \
    } while (0)

#define EXPECT_RAISE(c, msgs, kw, message)                                                 \
    do {                                                                                   \
        epyq_err e_ = {0};                                                                 \
        char *o_ = render_json((c), (msgs), (kw), &e_);                                    \
        ck_assert_msg(o_ == NULL, "expected raise_exception, rendered [%s]", o_);          \
        ck_assert_int_eq(e_.code, EPYQ_E_TEMPLATE);                                        \
        ck_assert_str_eq(e_.msg, (message));                                               \
    } while (0)

/* ---- fixtures ------------------------------------------------------------------------- */

typedef struct {
    cJSON **v;
    size_t n;
} jsonl;

static jsonl read_jsonl(const char *dir, const char *name) {
    char *path = epyq_path_join(dir, name), *text = NULL;
    size_t len = 0;
    epyq_err err = {0};
    ck_assert_msg(epyq_file_read(path, 64u << 20, &text, &len, &err) == EPYQ_OK, "%s", err.msg);
    free(path);
    jsonl out = {0};
    for (char *p = text; p < text + len;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        if (nl) *nl = '\0';
        if (*p) {
            cJSON *j = cJSON_Parse(p);
            ck_assert_msg(j != NULL, "bad JSONL line in %s", name);
            out.v = realloc(out.v, (out.n + 1) * sizeof *out.v);
            out.v[out.n++] = j;
        }
        p = nl ? nl + 1 : text + len;
    }
    free(text);
    return out;
}

static void free_jsonl(jsonl *j) {
    for (size_t i = 0; i < j->n; i++) cJSON_Delete(j->v[i]);
    free(j->v);
}

/* Renders every line with a "rendered" field; returns exact/total through the pointers. */
static void check_rendered_cases(const char *dir, const char *file, epyq_tok *tok, size_t *exact, size_t *total) {
    epyq_chat *c = real_chat();
    jsonl cases = read_jsonl(dir, file);
    *exact = *total = 0;
    for (size_t i = 0; i < cases.n; i++) {
        const cJSON *want = cJSON_GetObjectItem(cases.v[i], "rendered");
        if (!cJSON_IsString(want)) continue;
        const char *name = cJSON_GetObjectItem(cases.v[i], "name")->valuestring;
        (*total)++;
        char *out = NULL;
        size_t n = 0;
        epyq_err err = {0};
        ck_assert_msg(epyq_chat_render_request(c, cases.v[i], &out, &n, &err) == EPYQ_OK, "%s: %s", name, err.msg);
        ck_assert_msg(n == strlen(want->valuestring) && !memcmp(out, want->valuestring, n),
                      "%s: rendered prompt differs\n got: [%s]\nwant: [%s]", name, out, want->valuestring);
        (*exact)++;
        const cJSON *ids = cJSON_GetObjectItem(cases.v[i], "ids");
        if (tok && cJSON_IsArray(ids)) {
            int32_t *got = NULL;
            size_t ng = 0;
            ck_assert_msg(epyq_tok_encode(tok, out, n, &got, &ng, &err) == EPYQ_OK, "%s", err.msg);
            ck_assert_msg(ng == (size_t)cJSON_GetArraySize(ids), "%s: %zu ids, want %d", name, ng, cJSON_GetArraySize(ids));
            for (size_t k = 0; k < ng; k++)
                ck_assert_msg(got[k] == cJSON_GetArrayItem(ids, (int)k)->valueint, "%s: id %zu differs", name, k);
            free(got);
        }
        free(out);
    }
    free_jsonl(&cases);
    epyq_chat_free(c);
}

START_TEST(fixture_chat_cases) {
    const char *dir = fixture_dir();
    if (!dir) {
        printf("SKIP fixture_chat_cases: ../shared/fixtures/tokenizer not found\n");
        return;
    }
    epyq_tok *tok = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_tok_load(&tok, dir, &err) == EPYQ_OK, "%s", err.msg);
    size_t exact, total;
    check_rendered_cases(dir, "chat_cases.jsonl", tok, &exact, &total);
    printf("chat_cases.jsonl: %zu/%zu rendered exactly (ids checked)\n", exact, total);
    ck_assert_uint_eq(total, 8);
    epyq_tok_free(tok);
}
END_TEST

START_TEST(fixture_real_reference) {
    const char *dir = fixture_dir();
    if (!dir) {
        printf("SKIP fixture_real_reference: ../shared/fixtures/tokenizer not found\n");
        return;
    }
    size_t exact, total;
    /* Their ids come from the real 248k vocabulary, which the stand-in lacks: text only. */
    check_rendered_cases(dir, "real_qwen36_reference.jsonl", NULL, &exact, &total);
    printf("real_qwen36_reference.jsonl: %zu/%zu rendered exactly\n", exact, total);
    ck_assert_uint_eq(total, 5);
}
END_TEST

/* ---- the real template, project-local expectations ------------------------------------ */

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}}}}}]";

START_TEST(template_behaviour) {
    epyq_chat *c = real_chat();
    const char *dir = fixture_dir();
    if (dir) { /* synth's copy must be the real file, byte for byte */
        char *path = epyq_path_join(dir, "chat_template.jinja"), *text = NULL;
        size_t len = 0;
        epyq_err e = {0};
        ck_assert_msg(epyq_file_read(path, 1 << 20, &text, &len, &e) == EPYQ_OK, "%s", e.msg);
        ck_assert_uint_eq(len, strlen(epyq_synth_chat_template));
        ck_assert(!memcmp(text, epyq_synth_chat_template, len));
        free(text);
        free(path);
    }
    /* spec §5 example */
    EXPECT_CHAT(c, "[{\"role\": \"user\", \"content\": \"hi\"}]", "{\"add_generation_prompt\": true, \"enable_thinking\": false}",
                "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    EXPECT_CHAT(c, "[{\"role\": \"user\", \"content\": \"hi\"}]", "{\"add_generation_prompt\": true}",
                "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    EXPECT_CHAT(c, "[{\"role\": \"user\", \"content\": \"  hi \\n\"}]", NULL, "<|im_start|>user\nhi<|im_end|>\n");
    /* Old reasoning is dropped unless preserve_thinking; reasoning_content wins over inline. */
    const char *hist = "[{\"role\": \"user\", \"content\": \"q1\"},"
                       "{\"role\": \"assistant\", \"reasoning_content\": \" r1 \", \"content\": \"a1\"},"
                       "{\"role\": \"user\", \"content\": \"q2\"}]";
    EXPECT_CHAT(c, hist, NULL, "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n");
    EXPECT_CHAT(c, hist, "{\"preserve_thinking\": true}",
                "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n"
                "<|im_start|>user\nq2<|im_end|>\n");
    /* An assistant turn after the last query keeps its (inline) reasoning. */
    EXPECT_CHAT(c, "[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nans\"}]",
                NULL, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nans<|im_end|>\n");
    /* Tool calls: raw strings, tojson for the rest, "\n\n" only after non-empty content;
     * OpenAI-style string arguments are parsed first; consecutive tool results share a turn. */
    const char *calls = "[{\"role\": \"user\", \"content\": \"w?\"},"
                        "{\"role\": \"assistant\", \"content\": \"Checking.\", \"tool_calls\": ["
                        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"s\": \"x y\", \"n\": 3, \"l\": [1, \"a\"]}}},"
                        "{\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"{\\\"k\\\": true}\"}}]},"
                        "{\"role\": \"tool\", \"content\": \"r1\"}, {\"role\": \"tool\", \"content\": \"r2\"}]";
    EXPECT_CHAT(c, calls, "{\"add_generation_prompt\": true, \"enable_thinking\": false}",
                "<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n\n"
                "<tool_call>\n<function=f>\n<parameter=s>\nx y\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
                "<parameter=l>\n[1, \"a\"]\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=g>\n<parameter=k>\ntrue\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
                "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* Tools with a system message: the system text follows the instructions block. */
    char *kw = malloc(strlen(TOOLS) + 64);
    sprintf(kw, "{\"tools\": %s}", TOOLS);
    epyq_err err = {0};
    char *out = render_json(c, "[{\"role\": \"system\", \"content\": \"SYS\"}, {\"role\": \"user\", \"content\": \"u\"}]", kw, &err);
    ck_assert_msg(out, "%s", err.msg);
    const char *head = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
                       "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
                       "\"properties\": {\"city\": {\"type\": \"string\"}}}}}\n</tools>\n\nIf you choose to call a function";
    ck_assert_msg(!strncmp(out, head, strlen(head)), "tools header differs: [%s]", out);
    const char *tail = "</IMPORTANT>\n\nSYS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n";
    ck_assert_msg(strlen(out) > strlen(tail) && !strcmp(out + strlen(out) - strlen(tail), tail), "tools tail differs: [%s]", out);
    free(out);
    free(kw);
    /* Images and videos, with add_vision_id numbering across the conversation. */
    EXPECT_CHAT(c,
                "[{\"role\": \"user\", \"content\": [{\"type\": \"image\"}, {\"type\": \"text\", \"text\": \"and\"}, "
                "{\"type\": \"video\"}, {\"image_url\": \"u\"}]}]",
                "{\"add_vision_id\": true}",
                "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>andVideo 1: "
                "<|vision_start|><|video_pad|><|vision_end|>Picture 2: <|vision_start|><|image_pad|><|vision_end|><|im_end|>\n");
    epyq_chat_free(c);
}
END_TEST

START_TEST(template_raises) {
    epyq_chat *c = real_chat();
    EXPECT_RAISE(c, "[]", NULL, "No messages provided.");
    EXPECT_RAISE(c, "[{\"role\": \"assistant\", \"content\": \"x\"}]", NULL, "No user query found in messages.");
    EXPECT_RAISE(c, "[{\"role\": \"user\", \"content\": \"<tool_response>x</tool_response>\"}]", NULL,
                 "No user query found in messages.");
    EXPECT_RAISE(c, "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"system\", \"content\": \"s\"}]", NULL,
                 "System message must be at the beginning.");
    EXPECT_RAISE(c, "[{\"role\": \"developer\", \"content\": \"d\"}, {\"role\": \"user\", \"content\": \"a\"}]", NULL,
                 "Unexpected message role.");
    EXPECT_RAISE(c, "[{\"role\": \"system\", \"content\": [{\"type\": \"image\"}]}, {\"role\": \"user\", \"content\": \"a\"}]",
                 NULL, "System message cannot contain images.");
    EXPECT_RAISE(c, "[{\"role\": \"system\", \"content\": [{\"video\": \"v\"}]}, {\"role\": \"user\", \"content\": \"a\"}]",
                 NULL, "System message cannot contain videos.");
    EXPECT_RAISE(c, "[{\"role\": \"user\", \"content\": [{\"type\": \"audio\"}]}]", NULL, "Unexpected item type in content.");
    EXPECT_RAISE(c, "[{\"role\": \"user\", \"content\": 5}]", NULL, "Unexpected content type.");
    epyq_chat_free(c);
}
END_TEST

START_TEST(prompt_opens_think) {
    const char *a = "<|im_start|>assistant\n<think>\n";
    const char *b = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    ck_assert(epyq_chat_prompt_opens_think(a, strlen(a)));
    ck_assert(!epyq_chat_prompt_opens_think(b, strlen(b)));
    ck_assert(!epyq_chat_prompt_opens_think("plain", 5));
}
END_TEST

/* ---- the CLI -------------------------------------------------------------------------- */

/* Runs `epyq template ARGS`, capturing stdout; returns the exit status. */
static int run_cli(const char *args, char **out, size_t *len) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' template %s 2>/dev/null", epyq_test_bin(), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    epyq_sbuf b = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) epyq_sbuf_add(&b, buf, n);
    int st = pclose(p);
    *out = epyq_sbuf_take(&b, len);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(cli_template) {
    char *out;
    size_t len;
    ck_assert_int_eq(run_cli("--help", &out, &len), 0);
    ck_assert(strstr(out, "usage: epyq template") != NULL);
    free(out);
    ck_assert_int_eq(run_cli("-m /nonexistent", &out, &len), 2);
    free(out);
    const char *dir = fixture_dir();
    char *tmp = epyq_test_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    char model[4096];
    if (dir) {
        snprintf(model, sizeof model, "%s", dir);
    } else {
        /* A folder holding only tokenizer_config.json with the template. */
        snprintf(model, sizeof model, "%s", tmp);
        cJSON *cfg = cJSON_CreateObject();
        cJSON_AddStringToObject(cfg, "chat_template", epyq_synth_chat_template);
        char *text = cJSON_PrintUnformatted(cfg);
        char *path = epyq_path_join(tmp, "tokenizer_config.json");
        epyq_err err;
        ck_assert(epyq_file_write_atomic(path, text, strlen(text), &err) == EPYQ_OK);
        free(path);
        free(text);
        cJSON_Delete(cfg);
    }
    char *req = epyq_path_join(tmp, "req.json");
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                       "\"kwargs\": {\"add_generation_prompt\": true, \"enable_thinking\": false}}";
    epyq_err err;
    ck_assert(epyq_file_write_atomic(req, body, strlen(body), &err) == EPYQ_OK);
    char args[8192];
    snprintf(args, sizeof args, "-m '%s' -i '%s'", model, req);
    ck_assert_int_eq(run_cli(args, &out, &len), 0);
    const char *want = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    ck_assert_uint_eq(len, strlen(want)); /* exactly the prompt: no newline added */
    ck_assert_str_eq(out, want);
    free(out);
    if (dir) {
        /* Control tokens become their ids: 248045 <|im_start|>, 248046 <|im_end|>, 248068/9 think. */
        snprintf(args, sizeof args, "-m '%s' -i '%s' --ids", model, req);
        ck_assert_int_eq(run_cli(args, &out, &len), 0);
        ck_assert_msg(!strncmp(out, "[248045, ", 9), "%s", out);
        ck_assert_msg(strstr(out, "248046, 198, 248045") && strstr(out, "248068, 271, 248069, 271]"), "%s", out);
        free(out);
    }
    const char *bad = "{\"messages\": [{\"role\": \"developer\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"u\"}]}";
    ck_assert(epyq_file_write_atomic(req, bad, strlen(bad), &err) == EPYQ_OK);
    snprintf(args, sizeof args, "-m '%s' -i '%s'", model, req);
    ck_assert_int_eq(run_cli(args, &out, &len), 1);
    ck_assert_uint_eq(len, 0);
    free(out);
    free(req);
    free(tmp);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chat");
    TCase *tc = epyq_test_case(s, "chat", 120);
    EPYQ_TESTS_ADD(tc, fixture_chat_cases, fixture_real_reference, template_behaviour,
                   template_raises, prompt_opens_think, cli_template);
    return epyq_test_run(s);
}
