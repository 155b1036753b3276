/* tests/unit/test_load_st.c — every safetensors validation rule (docs/architecture.md §3.1 and what
 * epyq adds: duplicate keys, name/count caps, strict UTF-8 JSON object, index <-> shard
 * consistency), with hand-made bad headers and files. Each refusal must be EPYQ_E_FORMAT with
 * one line naming the file and, where there is one, the tensor and the rule. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "load/safetensors.h"
#include "tests/check_main.h"
#include "tests/files/tiny_ckpt.h"
#include "tests/testutil.h"

/* A file image: u64 header length, the header text, then data_len bytes 0..255 repeating. */
static uint8_t *image(const char *hdr, size_t data_len, size_t *len) {
    size_t hl = strlen(hdr);
    *len = 8 + hl + data_len;
    uint8_t *b = malloc(*len + 1);
    uint64_t n = hl;
    memcpy(b, &n, 8);
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)i;
    return b;
}

static epyq_status parse_hdr(const char *hdr, size_t data_len, epyq_err *err) {
    size_t len;
    uint8_t *b = image(hdr, data_len, &len);
    epyq_st_header h;
    epyq_status st = epyq_st_parse(&h, b, len, len, "x.safetensors", err);
    if (!st) epyq_st_header_free(&h);
    free(b);
    return st;
}

/* The header must be refused with E_FORMAT and the message must contain needle. */
static void refuse(const char *hdr, size_t data_len, const char *needle) {
    epyq_err err = {0};
    epyq_status st = parse_hdr(hdr, data_len, &err);
    ck_assert_msg(st == EPYQ_E_FORMAT, "accepted or wrong code (%s) for %s", epyq_status_name(st), hdr);
    ck_assert_msg(strstr(err.msg, "x.safetensors") != NULL, "file not named: %s", err.msg);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "'%s' not in: %s", needle, err.msg);
    ck_assert_ptr_null(strchr(err.msg, '\n'));
}

static const char *good =
    "{\"__metadata__\": {\"format\": \"pt\"}, \"b\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [8, 20]},"
    " \"a\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"e\": {\"dtype\": \"F32\", \"shape\": [0],"
    " \"data_offsets\": [20, 20]}}    ";

START_TEST(valid_header) {
    size_t len;
    uint8_t *b = image(good, 20, &len);
    epyq_st_header h;
    epyq_err err;
    ck_assert_msg(epyq_st_parse(&h, b, len, len, "x.safetensors", &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq(h.n, 3);
    /* data order: a [0, 8), b [8, 20), empty e at 20 */
    ck_assert_str_eq(h.t[0].name, "a");
    ck_assert_str_eq(h.t[1].name, "b");
    ck_assert_str_eq(h.t[2].name, "e");
    ck_assert_int_eq(h.t[1].dtype, EPYQ_DT_BF16);
    ck_assert_int_eq(h.t[1].ndim, 2);
    ck_assert_int_eq(h.t[1].shape[1], 3);
    ck_assert_uint_eq(h.t[1].nbytes, 12);
    ck_assert_ptr_eq(h.t[1].data, b + 8 + strlen(good) + 8);
    ck_assert_uint_eq(h.data_start, 8 + strlen(good));
    epyq_st_header_free(&h);
    /* only the header available (file says more): data pointers are NULL, not out of bounds */
    ck_assert_int_eq(epyq_st_parse(&h, b, 8 + strlen(good), len, "x.safetensors", &err), EPYQ_OK);
    ck_assert_ptr_null(h.t[0].data);
    epyq_st_header_free(&h);
    free(b);
}
END_TEST

START_TEST(truncation_everywhere) {
    /* Cut the file at every byte: every prefix must be refused, none may crash or read past it. */
    size_t len;
    uint8_t *b = image(good, 20, &len);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *c = malloc(cut ? cut : 1);
        memcpy(c, b, cut);
        epyq_st_header h;
        epyq_err err;
        epyq_status st = epyq_st_parse(&h, c, cut, cut, "x.safetensors", &err);
        ck_assert_msg(st == EPYQ_E_FORMAT, "cut at %zu accepted (%s)", cut, epyq_status_name(st));
        free(c);
    }
    /* a cut inside the 8 length bytes and one in the data section name their rule */
    epyq_st_header h;
    epyq_err err;
    ck_assert_int_eq(epyq_st_parse(&h, b, 5, 5, "x.safetensors", &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "HeaderTooSmall"));
    ck_assert_int_eq(epyq_st_parse(&h, b, len - 1, len - 1, "x.safetensors", &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "MetadataIncompleteBuffer"));
    free(b);
}
END_TEST

START_TEST(header_length) {
    uint8_t b[16] = {0};
    epyq_st_header h;
    epyq_err err;
    uint64_t huge = UINT64_MAX;
    memcpy(b, &huge, 8);
    ck_assert_int_eq(epyq_st_parse(&h, b, 16, 16, "x.safetensors", &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "HeaderTooLarge"));
    uint64_t cap = EPYQ_ST_HEADER_MAX + 1ull;
    memcpy(b, &cap, 8);
    ck_assert_int_eq(epyq_st_parse(&h, b, 16, 16, "x.safetensors", &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "HeaderTooLarge"));
    uint64_t past = 9; /* 9 bytes claimed, 8 present */
    memcpy(b, &past, 8);
    ck_assert_int_eq(epyq_st_parse(&h, b, 16, 16, "x.safetensors", &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "InvalidHeaderLength"));
}
END_TEST

START_TEST(offsets) {
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
           " \"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [2, 6]}}", 6, "overlap");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
           " \"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [6, 10]}}", 10, "gap");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [2, 6]}}", 6, "tensor a: data begins at 2");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [4, 0]}}", 4, "InvalidOffset");
    /* lying end: offsets promise more data than the file holds */
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [64], \"data_offsets\": [0, 64]}}", 10, "MetadataIncompleteBuffer");
    /* trailing bytes after the last tensor */
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 5, "MetadataIncompleteBuffer");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0]}}", 4, "data_offsets");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, -4]}}", 4, "data_offsets");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4.5]}}", 4, "data_offsets");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 1e300]}}", 4, "data_offsets");
}
END_TEST

START_TEST(shapes_and_dtypes) {
    refuse("{\"a\": {\"dtype\": \"I32\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4, "TensorInvalidInfo");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", 0,
           "ValidationOverflow");
    refuse("{\"a\": {\"dtype\": \"F64\", \"shape\": [2305843009213693952], \"data_offsets\": [0, 0]}}", 0, "shape");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [-1], \"data_offsets\": [0, 0]}}", 0, "shape[0]");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [1.5], \"data_offsets\": [0, 0]}}", 0, "shape[0]");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": \"4\", \"data_offsets\": [0, 4]}}", 4, "shape");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1, "dimensions");
    refuse("{\"a\": {\"dtype\": \"Q4_K\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4, "unknown dtype \"Q4_K\"");
    refuse("{\"a\": {\"dtype\": 4, \"shape\": [4], \"data_offsets\": [0, 4]}}", 4, "dtype");
    refuse("{\"a\": {\"shape\": [4], \"data_offsets\": [0, 4]}}", 4, "dtype");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4], \"extra\": 1}}", 4, "unknown field");
    refuse("{\"a\": [1, 2]}", 0, "tensor a: expected an object");
    /* every dtype of the table parses with its size */
    static const char *names[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                                  "I32", "U32", "F32", "F64", "I64", "U64"};
    static const size_t sizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    for (int i = 0; i < 15; i++) {
        ck_assert_int_eq(epyq_dtype_parse(names[i]), i);
        ck_assert_uint_eq(epyq_dtype_size((epyq_dtype)i), sizes[i]);
        char h[160];
        snprintf(h, sizeof h, "{\"a\": {\"dtype\": \"%s\", \"shape\": [3], \"data_offsets\": [0, %zu]}}", names[i], 3 * sizes[i]);
        epyq_err err;
        ck_assert_msg(parse_hdr(h, 3 * sizes[i], &err) == EPYQ_OK, "%s", err.msg);
    }
}
END_TEST

START_TEST(json_rules) {
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
           " \"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}", 2, "duplicate key \"a\"");
    refuse("{\"a\": {\"dtype\": \"U8\", \"dtype\": \"I8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, "duplicate key");
    refuse("[]", 0, "expected a JSON object");
    refuse("\"tensor\"", 0, "expected a JSON object");
    refuse("        ", 0, "expected a JSON object");
    refuse("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}", 1, "malformed JSON");
    refuse("{} {}", 0, "unexpected data after");
    refuse("{\"\xC3\x28\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, "UTF-8");
    refuse("{\"\xC0\xAF\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, "UTF-8"); /* overlong */
    refuse("{\"\xED\xA0\x80\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, "UTF-8"); /* surrogate */
    refuse("{\"a\tb\x01\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, "control character");
    refuse("{\"__metadata__\": {\"format\": 1}}", 0, "__metadata__.format");
    refuse("{\"__metadata__\": [\"pt\"]}", 0, "__metadata__");
    refuse("{\"\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, "tensor name of 0 bytes");
    char *longname = malloc(EPYQ_ST_NAME_MAX + 200);
    int o = sprintf(longname, "{\"");
    for (unsigned i = 0; i < EPYQ_ST_NAME_MAX + 1; i++) longname[o++] = 'n';
    sprintf(longname + o, "\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}");
    refuse(longname, 1, "tensor name of 513 bytes");
    free(longname);
    /* a valid UTF-8 name and the empty object are fine */
    epyq_err err;
    ck_assert_int_eq(parse_hdr("{\"\xC3\xA9\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, &err), EPYQ_OK);
    ck_assert_int_eq(parse_hdr("{}", 0, &err), EPYQ_OK);
}
END_TEST

/* ---- folders: index <-> shards ---- */

static char *folder(int nshards) {
    tc_opts o = tc_defaults(EPYQ_QF_NONE);
    o.nshards = nshards;
    char *dir = tc_write_tmp(&o, NULL, NULL);
    ck_assert_ptr_nonnull(dir);
    return dir;
}

static void rm_dir(char *dir) { ck_assert_int_eq(epyq_test_rm_dir(dir), 0); }

/* Replace the first occurrence of `from` with `to` in dir/name. */
static void edit(const char *dir, const char *name, const char *from, const char *to) {
    char p[4200], *text;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    epyq_err err;
    ck_assert_int_eq(epyq_file_read(p, 1 << 24, &text, NULL, &err), EPYQ_OK);
    char *at = strstr(text, from);
    ck_assert_msg(at != NULL, "test bug: '%s' not in %s", from, name);
    size_t n = strlen(text) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    ck_assert_int_eq(tc_write_text(dir, name, out), 0);
    free(text);
    free(out);
}

static void open_fails(const char *dir, epyq_status want, const char *n1, const char *n2) {
    epyq_ckpt *c = NULL;
    epyq_err err = {0};
    epyq_status st = epyq_ckpt_open(&c, dir, &err);
    ck_assert_msg(st == want, "got %s: %s", epyq_status_name(st), err.msg);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(err.msg, n1) != NULL, "'%s' not in: %s", n1, err.msg);
    if (n2) ck_assert_msg(strstr(err.msg, n2) != NULL, "'%s' not in: %s", n2, err.msg);
}

#define EMB "model.language_model.embed_tokens.weight"

START_TEST(folder_ok) {
    char *dir = folder(3);
    epyq_ckpt *c;
    epyq_err err;
    ck_assert_msg(epyq_ckpt_open(&c, dir, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq(epyq_ckpt_nshards(c), 3);
    const epyq_tensor *t = epyq_ckpt_find(c, EMB);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->shape[0], TC_V);
    for (size_t i = 1; i < epyq_ckpt_count(c); i++)
        ck_assert_int_lt(strcmp(epyq_ckpt_at(c, i - 1)->name, epyq_ckpt_at(c, i)->name), 0);
    ck_assert_ptr_null(epyq_ckpt_find(c, "nope"));
    epyq_ckpt_free(c);
    rm_dir(dir);
    dir = folder(1);
    ck_assert_msg(epyq_ckpt_open(&c, dir, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq(epyq_ckpt_nshards(c), 1);
    epyq_ckpt_free(c);
    rm_dir(dir);
}
END_TEST

START_TEST(index_mismatch) {
    /* the index puts a tensor in the wrong shard */
    char *dir = folder(2);
    edit(dir, "model.safetensors.index.json", "\"" EMB "\": \"model-00001-of-00002", "\"" EMB "\": \"model-00002-of-00002");
    open_fails(dir, EPYQ_E_FORMAT, EMB, "index puts");
    rm_dir(dir);
    /* the index does not list a tensor a shard holds */
    dir = folder(2);
    edit(dir, "model.safetensors.index.json", "\"" EMB "\": \"model-00001-of-00002.safetensors\", ", "");
    open_fails(dir, EPYQ_E_FORMAT, EMB, "does not list");
    rm_dir(dir);
    /* the index lists a tensor no shard holds */
    dir = folder(2);
    edit(dir, "model.safetensors.index.json", "\"weight_map\": {", "\"weight_map\": {\"ghost.weight\": \"model-00001-of-00002.safetensors\", ");
    open_fails(dir, EPYQ_E_FORMAT, "ghost.weight", "does not contain it");
    rm_dir(dir);
    /* the index names a shard that is not there */
    dir = folder(2);
    edit(dir, "model.safetensors.index.json", "\"" EMB "\": \"model-00001-of-00002", "\"" EMB "\": \"model-00009-of-00002");
    open_fails(dir, EPYQ_E_IO, "model-00009-of-00002.safetensors", "cannot open");
    rm_dir(dir);
    /* paths outside the folder are refused before anything is opened */
    dir = folder(2);
    edit(dir, "model.safetensors.index.json", "\"" EMB "\": \"model-00001-of-00002", "\"" EMB "\": \"../model-00001-of-00002");
    open_fails(dir, EPYQ_E_FORMAT, EMB, "shard file name");
    rm_dir(dir);
    /* duplicate key in the index */
    dir = folder(2);
    edit(dir, "model.safetensors.index.json", "\"weight_map\": {", "\"weight_map\": {\"" EMB "\": \"model-00001-of-00002.safetensors\", ");
    open_fails(dir, EPYQ_E_FORMAT, "duplicate key", EMB);
    rm_dir(dir);
    /* weight_map missing / not an object */
    dir = folder(2);
    edit(dir, "model.safetensors.index.json", "\"weight_map\": {", "\"weight_mop\": {");
    open_fails(dir, EPYQ_E_FORMAT, "weight_map", NULL);
    rm_dir(dir);
    /* no checkpoint at all */
    dir = epyq_test_tmpdir();
    open_fails(dir, EPYQ_E_IO, "no model.safetensors", NULL);
    rm_dir(dir);
}
END_TEST

START_TEST(same_tensor_in_two_shards) {
    /* Two shards each holding tensor "a" (no index: a single-file checkpoint cannot do this, so
     * write an index that lists "a" once while both shards hold it). */
    char *dir = epyq_test_tmpdir();
    tc_list l = {0};
    tc_vec(&l, "a", 1, 4, 0, 0);
    char p[4200];
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    ck_assert_int_eq(tc_write_shard(p, &l, 0, 1), 0);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    ck_assert_int_eq(tc_write_shard(p, &l, 0, 1), 0);
    tc_free(&l);
    ck_assert_int_eq(tc_write_text(dir, "model.safetensors.index.json",
                                   "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}"), 0);
    open_fails(dir, EPYQ_E_FORMAT, "tensor a appears in both s1.safetensors and s2.safetensors", NULL);
    rm_dir(dir);
}
END_TEST

START_TEST(truncated_shard_file) {
    /* a short shard (download cut off): refused at open, naming the shard */
    char *dir = folder(2);
    char p[4200];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    FILE *f = fopen(p, "r+b");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    ck_assert_int_eq(truncate(p, size - 3), 0);
    open_fails(dir, EPYQ_E_FORMAT, "model-00002-of-00002.safetensors", "MetadataIncompleteBuffer");
    ck_assert_int_eq(truncate(p, 4), 0);
    open_fails(dir, EPYQ_E_FORMAT, "model-00002-of-00002.safetensors", "HeaderTooSmall");
    ck_assert_int_eq(truncate(p, 0), 0);
    open_fails(dir, EPYQ_E_FORMAT, "model-00002-of-00002.safetensors", "HeaderTooSmall");
    rm_dir(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("load_st");
    TCase *tc = epyq_test_case(s, "safetensors", 0);
    EPYQ_TESTS_ADD(tc, valid_header, truncation_everywhere, header_length, offsets,
                   shapes_and_dtypes, json_rules, folder_ok, index_mismatch,
                   same_tensor_in_two_shards, truncated_shard_file);
    return epyq_test_run(s);
}
