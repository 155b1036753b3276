/* tools/cmd_template.c — `epyq template`: render a chat request with the checkpoint's template.
 * Prints the prompt byte for byte (no newline added) or, with --ids, its token ids as a JSON
 * array (added/special tokens in the prompt become their ids, as the model will see them). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "core/util.h"
#include "tok/tokenizer.h"
#include "tools/cmd.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: epyq template -m DIR -i REQUEST.json [--ids]\n"
            "\n"
            "Renders a chat with the chat template of checkpoint folder DIR (chat_template.jinja or\n"
            "tokenizer_config.json) exactly as transformers' apply_chat_template would.\n"
            "\n"
            "  -m, --model DIR     folder with the tokenizer/template files\n"
            "  -i, --input FILE    request JSON: {\"messages\": [...], \"kwargs\": {\"add_generation_prompt\": true,\n"
            "                      \"enable_thinking\": false, \"preserve_thinking\": ..., \"tools\": [...], ...}}\n"
            "                      ('-' reads stdin)\n"
            "      --ids           print the prompt's token ids as a JSON array instead of the text\n"
            "  -h, --help          this help\n"
            "\n"
            "A raise_exception() in the template exits 1 with its message.\n");
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
        if (cap - n - 1 == 0) {
            char *nb = cap < ((size_t)256 << 20) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

static int print_ids(const char *dir, const char *text, size_t len) {
    epyq_err err = {0};
    epyq_tok *tok = NULL;
    if (epyq_tok_load(&tok, dir, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (epyq_tok_encode(tok, text, len, &ids, &n, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        rc = 1;
    } else {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        puts("]");
    }
    free(ids);
    epyq_tok_free(tok);
    return rc;
}

int epyq_cmd_template(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"input", required_argument, NULL, 'i'},
                                         {"ids", no_argument, NULL, 'I'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *dir = NULL, *input = NULL;
    bool want_ids = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "m:i:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'i': input = optarg; break;
        case 'I': want_ids = true; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "epyq template: unknown or incomplete option '%s' (try --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "epyq template: unexpected argument '%s' (try --help)\n", argv[optind]);
        return 2;
    }
    if (!dir || !input) {
        fprintf(stderr, "epyq template: -m DIR and -i REQUEST.json are required (try --help)\n");
        return 2;
    }
    size_t len = 0;
    char *text = NULL;
    epyq_err err = {0};
    if (!strcmp(input, "-")) {
        text = read_all(stdin, &len);
        if (!text) {
            fprintf(stderr, "epyq: cannot read the request from stdin\n");
            return 1;
        }
    } else if (epyq_file_read(input, (size_t)256 << 20, &text, &len, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    cJSON *req = cJSON_ParseWithOpts(text, NULL, true); /* no trailing garbage */
    free(text);
    if (!req) {
        fprintf(stderr, "epyq: %s: not valid JSON\n", input);
        return 1;
    }
    epyq_chat *chat = NULL;
    char *prompt = NULL;
    size_t plen = 0;
    int rc = 0;
    if (epyq_chat_load(&chat, dir, &err) != EPYQ_OK ||
        epyq_chat_render_request(chat, req, &prompt, &plen, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        rc = 1;
    } else if (want_ids) {
        rc = print_ids(dir, prompt, plen);
    } else if (fwrite(prompt, 1, plen, stdout) != plen || fflush(stdout) != 0) {
        fprintf(stderr, "epyq: cannot write the prompt to stdout\n");
        rc = 1;
    }
    free(prompt);
    epyq_chat_free(chat);
    cJSON_Delete(req);
    return rc;
}
