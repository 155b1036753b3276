/* tools/cmd_tokenize.c — `epyq tokenize` (text -> ids) and `epyq detokenize` (ids -> text).
 *
 * Both need only the tokenizer files of a checkpoint folder. Input bytes that are not UTF-8
 * are repaired the way a Rust String::from_utf8_lossy would (one U+FFFD per maximal invalid
 * subsequence) before encoding, since the reference tokenizer can only ever see valid strings.
 * By default the added tokens are those of tokenizer.json (what HF `tokenizers` does);
 * --config-tokens also registers the ones only tokenizer_config.json declares (what
 * `transformers` does; for Qwen3.6 the 7 audio/TTS tokens 248070..248076). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tok/json_text.h"
#include "tok/sbuf.h"
#include "tok/tokenizer.h"
#include "tools/cmd.h"

typedef struct {
    const char *dir;
    bool jsonl, config_tokens, split_special, skip_special;
} tok_args;

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: epyq tokenize -m DIR [--jsonl] [--config-tokens] [--split-special]\n"
            "\n"
            "Encode text with DIR/tokenizer.json (+ tokenizer_config.json), like HF tokenizers'\n"
            "encode(text, add_special_tokens=False).\n"
            "  default          all of stdin is one text; prints one JSON id array\n"
            "  --jsonl          each stdin line is a JSON object with a \"text\" string; prints one\n"
            "                   {\"ids\": [...]} line per input line (blank lines are skipped)\n"
            "  --config-tokens  also register added tokens only tokenizer_config.json declares\n"
            "                   (transformers' behaviour)\n"
            "  --split-special  spell out special tokens written in the text instead of matching them\n"
            "Invalid UTF-8 on stdin is replaced by U+FFFD per maximal invalid subsequence.\n");
}

static void detokenize_usage(FILE *f) {
    fprintf(f,
            "usage: epyq detokenize -m DIR [--skip-special] [--config-tokens]\n"
            "\n"
            "Decode a JSON array of token ids on stdin to text on stdout (no newline added), like\n"
            "HF tokenizers' decode(ids). Ids with no token decode to nothing.\n"
            "  --skip-special   drop special tokens (skip_special_tokens=True)\n"
            "  --config-tokens  also know added tokens only tokenizer_config.json declares\n");
}

/* 0 = parsed, 1 = --help shown, 2 = usage error (reported). */
static int parse_args(int argc, char **argv, bool detok, tok_args *a) {
    void (*usage)(FILE *) = detok ? detokenize_usage : tokenize_usage;
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "epyq %s: %s needs a folder\n", argv[0], o);
                return 2;
            }
            a->dir = argv[++i];
        } else if (!strncmp(o, "--model=", 8)) {
            a->dir = o + 8;
        } else if (!strcmp(o, "--config-tokens")) {
            a->config_tokens = true;
        } else if (!detok && !strcmp(o, "--jsonl")) {
            a->jsonl = true;
        } else if (!detok && !strcmp(o, "--split-special")) {
            a->split_special = true;
        } else if (detok && (!strcmp(o, "--skip-special") || !strcmp(o, "--skip-special-tokens"))) {
            a->skip_special = true;
        } else {
            fprintf(stderr, "epyq %s: unknown option '%s' (try epyq %s --help)\n", argv[0], o, argv[0]);
            return 2;
        }
    }
    if (!a->dir) {
        fprintf(stderr, "epyq %s: -m DIR is required (try epyq %s --help)\n", argv[0], argv[0]);
        return 2;
    }
    return 0;
}

static int load(const tok_args *a, epyq_tok **t) {
    epyq_tok_opts o = epyq_tok_opts_default();
    o.config_added_tokens = a->config_tokens;
    epyq_err err;
    if (epyq_tok_load_opts(t, a->dir, &o, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static bool read_all(FILE *f, epyq_sbuf *b) {
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (!epyq_sbuf_add(b, chunk, n)) return false;
    return !ferror(f);
}

static bool print_ids(epyq_sbuf *o, const int32_t *ids, size_t n) {
    bool ok = epyq_sbuf_addc(o, '[');
    for (size_t i = 0; i < n && ok; i++) ok = epyq_sbuf_printf(o, i ? ", %d" : "%d", (int)ids[i]);
    return ok && epyq_sbuf_addc(o, ']');
}

static int encode_one(const epyq_tok *t, const tok_args *a, const char *text, size_t len, bool jsonl, size_t line) {
    int32_t *ids;
    size_t n;
    epyq_err err;
    if (epyq_tok_encode_ex(t, text, len, a->split_special ? EPYQ_TOK_ENC_SPLIT_SPECIAL : 0, &ids, &n, &err) != EPYQ_OK) {
        if (jsonl)
            fprintf(stderr, "epyq: stdin line %zu: %s\n", line, err.msg);
        else
            fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    epyq_sbuf o = {0};
    bool ok = (!jsonl || epyq_sbuf_adds(&o, "{\"ids\": ")) && print_ids(&o, ids, n) && (!jsonl || epyq_sbuf_addc(&o, '}')) &&
              epyq_sbuf_addc(&o, '\n');
    free(ids);
    ok = ok && fwrite(o.p, 1, o.len, stdout) == o.len && fflush(stdout) == 0;
    epyq_sbuf_free(&o);
    if (!ok) {
        fprintf(stderr, "epyq: cannot write the ids to stdout\n");
        return 1;
    }
    return 0;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

static int tokenize_jsonl(const epyq_tok *t, const tok_args *a) {
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    int rc = 0;
    while (!rc && (got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        if (blank(line, len)) continue;
        char *text;
        size_t tl;
        bool found;
        epyq_err err;
        if (epyq_json_text_field(line, len, "text", &text, &tl, &found, &err) != EPYQ_OK) {
            fprintf(stderr, "epyq: stdin line %zu: not a JSON object with a \"text\" string: %s\n", lineno, err.msg);
            rc = 1;
        } else if (!found) {
            fprintf(stderr, "epyq: stdin line %zu: the object has no \"text\" key\n", lineno);
            rc = 1;
        } else {
            rc = encode_one(t, a, text, tl, true, lineno);
            free(text);
        }
    }
    free(line);
    if (!rc && ferror(stdin)) {
        fprintf(stderr, "epyq: cannot read stdin\n");
        rc = 1;
    }
    return rc;
}

int epyq_cmd_tokenize(int argc, char **argv) {
    tok_args a;
    int pr = parse_args(argc, argv, false, &a);
    if (pr) return pr == 1 ? 0 : 2;
    epyq_tok *t;
    if (load(&a, &t)) return 1;
    int rc;
    if (a.jsonl) {
        rc = tokenize_jsonl(t, &a);
    } else {
        epyq_sbuf in = {0};
        if (!read_all(stdin, &in)) {
            fprintf(stderr, "epyq: cannot read stdin\n");
            rc = 1;
        } else {
            rc = encode_one(t, &a, in.p ? in.p : "", in.len, false, 0);
        }
        epyq_sbuf_free(&in);
    }
    epyq_tok_free(t);
    return rc;
}

/* A JSON array of integer ids; ids are u32 in the reference, so negative ones are refused
 * and ids beyond the vocabulary decode to nothing. */
static int parse_id_array(const char *text, size_t len, int32_t **ids, size_t *n) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    while (j && end && end < text + len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')) end++;
    if (!j || !cJSON_IsArray(j) || (end && end != text + len)) {
        fprintf(stderr, "epyq: stdin: expected one JSON array of token ids, like [9707, 1879]\n");
        cJSON_Delete(j);
        return 1;
    }
    size_t k = (size_t)cJSON_GetArraySize(j), i = 0;
    *ids = malloc((k ? k : 1) * sizeof **ids);
    if (!*ids) {
        cJSON_Delete(j);
        fprintf(stderr, "epyq: out of memory for %zu ids\n", k);
        return 1;
    }
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != (double)(int64_t)d || d < 0 || d > 4294967295.0) {
            fprintf(stderr, "epyq: stdin: element %zu: expected a token id (an integer in 0..4294967295)\n", i);
            free(*ids);
            *ids = NULL;
            cJSON_Delete(j);
            return 1;
        }
        /* Above INT32_MAX no tokenizer has a token: keep it unknown (-1 is never a token). */
        (*ids)[i] = d > 2147483647.0 ? -1 : (int32_t)d;
    }
    *n = k;
    cJSON_Delete(j);
    return 0;
}

int epyq_cmd_detokenize(int argc, char **argv) {
    tok_args a;
    int pr = parse_args(argc, argv, true, &a);
    if (pr) return pr == 1 ? 0 : 2;
    epyq_sbuf in = {0};
    if (!read_all(stdin, &in)) {
        epyq_sbuf_free(&in);
        fprintf(stderr, "epyq: cannot read stdin\n");
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = parse_id_array(in.p ? in.p : "", in.len, &ids, &n);
    epyq_sbuf_free(&in);
    epyq_tok *t = NULL;
    if (!rc) rc = load(&a, &t);
    if (!rc) {
        char *text;
        size_t tl;
        epyq_err err;
        if (epyq_tok_decode(t, ids, n, a.skip_special, &text, &tl, &err) != EPYQ_OK) {
            fprintf(stderr, "epyq: %s\n", err.msg);
            rc = 1;
        } else {
            if (fwrite(text, 1, tl, stdout) != tl || fflush(stdout) != 0) {
                fprintf(stderr, "epyq: cannot write the text to stdout\n");
                rc = 1;
            }
            free(text);
        }
    }
    free(ids);
    epyq_tok_free(t);
    return rc;
}
