/* tests/unit/tok_tiny.h — a tiny byte-level BPE tokenizer.json (+ tokenizer_config.json)
 * written into a fresh temporary folder, for the tokenizer tests and fuzzers that must run
 * without ../shared. Its content is spelled out here, independently of src/tok:
 *   ids 0..255   the 256 bytes (id = byte value), in GPT-2's byte-to-unicode spelling
 *   256..264     merges, in rank order: Ġ t, h e, Ġt he, l l, e ll, h ell, hell o, a a, ' s
 *   265 <|end|>  special;  266 <think> (listed as id 300: the loader must reassign it);
 *   267 <mask>   special, lstrip + rstrip;  268 zz  single_word
 *   tokenizer_config.json: eos/pad <|end|>, chat_template "{{ x }}", and <|cfg|> (269) only there
 * with the Qwen3.5 split regex, NFC (or the given normalizer JSON) and ByteLevel. */
#ifndef EPYQ_TEST_TOK_TINY_H
#define EPYQ_TEST_TOK_TINY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/util.h"
#include "tests/testutil.h"
#include "tok/sbuf.h"

/* GPT-2's bytes_to_unicode, written out independently of src/tok/bytelevel.c. */
static inline void tok_tiny_byte_chars(uint32_t cp[256]) {
    bool direct[256] = {false};
    for (int b = '!'; b <= '~'; b++) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) cp[b] = direct[b] ? (uint32_t)b : next++;
}

static inline void tok_tiny_json_char(epyq_sbuf *b, uint32_t cp) {
    if (cp == '"' || cp == '\\')
        epyq_sbuf_printf(b, "\\%c", (char)cp);
    else
        epyq_sbuf_printf(b, "\\u%04x", cp);
}

/* Qwen3.5 split pattern, as a JSON string literal. */
#define QWEN_SPLIT                                                                                                      \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| "                        \
    "?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"

/* Ids: byte b -> b; 256 "Ġt", 257 "he", 258 "Ġthe", 259 "ll", 260 "ell", 261 "hell",
 * 262 "hello", 263 "aa", 264 "'s"; added tokens from 265 on. */
static const char *const MERGES[][2] = {{"\\u0120", "t"}, {"h", "e"}, {"\\u0120t", "he"}, {"l", "l"}, {"e", "ll"},
                                        {"h", "ell"},     {"hell", "o"}, {"a", "a"},        {"'", "s"}};
static const char *const MERGED[] = {"\\u0120t", "he", "\\u0120the", "ll", "ell", "hell", "hello", "aa", "'s"};

static inline char *tok_tiny_write(bool string_merges, const char *normalizer, const char *extra_merge) {
    char *dir = epyq_test_tmpdir();
    if (!dir) return NULL;
    uint32_t cp[256];
    tok_tiny_byte_chars(cp);
    epyq_sbuf j = {0};
    epyq_sbuf_adds(&j, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
                       "{\"id\":265,\"content\":\"<|end|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
                       "{\"id\":300,\"content\":\"<think>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":false},"
                       "{\"id\":267,\"content\":\"<mask>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":true},"
                       "{\"id\":268,\"content\":\"zz\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":false}],");
    epyq_sbuf_printf(&j, "\"normalizer\":%s,", normalizer);
    epyq_sbuf_adds(&j, "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"" QWEN_SPLIT
                       "\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                       "\"trim_offsets\":false,\"use_regex\":false}]},\"post_processor\":null,"
                       "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false},"
                       "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":\"\","
                       "\"end_of_word_suffix\":\"\",\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        epyq_sbuf_adds(&j, "\"");
        tok_tiny_json_char(&j, cp[b]);
        epyq_sbuf_printf(&j, "\":%d,", b);
    }
    for (size_t m = 0; m < sizeof MERGED / sizeof MERGED[0]; m++) epyq_sbuf_printf(&j, "\"%s\":%zu%s", MERGED[m], 256 + m, m + 1 < 9 ? "," : "");
    epyq_sbuf_adds(&j, "},\"merges\":[");
    for (size_t m = 0; m < sizeof MERGES / sizeof MERGES[0]; m++) {
        if (string_merges)
            epyq_sbuf_printf(&j, "\"%s %s\",", MERGES[m][0], MERGES[m][1]);
        else
            epyq_sbuf_printf(&j, "[\"%s\",\"%s\"],", MERGES[m][0], MERGES[m][1]);
    }
    epyq_sbuf_adds(&j, extra_merge ? extra_merge : "");
    j.p[--j.len] = '\0'; /* drop the last comma */
    epyq_sbuf_adds(&j, "]}}");
    char *path = epyq_path_join(dir, "tokenizer.json");
    epyq_err err;
    bool ok = epyq_file_write_atomic(path, j.p, j.len, &err) == EPYQ_OK;
    free(path);
    epyq_sbuf_free(&j);
    static const char cfg[] = "{\"eos_token\":\"<|end|>\",\"pad_token\":{\"content\":\"<|end|>\"},\"chat_template\":\"{{ x }}\","
                              "\"added_tokens_decoder\":{\"265\":{\"content\":\"<|end|>\",\"special\":true},"
                              "\"269\":{\"content\":\"<|cfg|>\",\"special\":true,\"normalized\":false}}}";
    path = epyq_path_join(dir, "tokenizer_config.json");
    ok = ok && epyq_file_write_atomic(path, cfg, sizeof cfg - 1, &err) == EPYQ_OK;
    free(path);
    if (!ok) {
        free(dir);
        return NULL;
    }
    return dir;
}

/* The default tiny tokenizer (NFC, array merges); the folder name is malloc'd, NULL on failure. */
static inline char *tok_tiny_default(void) { return tok_tiny_write(false, "{\"type\":\"NFC\"}", NULL); }

#endif
