/* tools/epyq.c — `epyq <command> [options]`: dispatches to tools/cmd_<command>.c.
 * Commands are declared weak so the program links while a command is being written;
 * a command that is not linked in says so instead of crashing. */
#include <stdio.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <unistd.h>
#include <string.h>

#include "config.h"
#include "tools/cmd.h"

#pragma weak epyq_cmd_inspect
#pragma weak epyq_cmd_synth
#pragma weak epyq_cmd_logits
#pragma weak epyq_cmd_tokenize
#pragma weak epyq_cmd_detokenize
#pragma weak epyq_cmd_template
#pragma weak epyq_cmd_run
#pragma weak epyq_cmd_chat
#pragma weak epyq_cmd_batch
#pragma weak epyq_cmd_bench
#pragma weak epyq_cmd_ppl
#pragma weak epyq_cmd_serve

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    {"chat", epyq_cmd_chat, "interactive chat REPL"},
    {"run", epyq_cmd_run, "one-shot generation to stdout"},
    {"batch", epyq_cmd_batch, "OpenAI-style JSONL batch job (resumable)"},
    {"serve", epyq_cmd_serve, "OpenAI-compatible HTTP server (continuous batching)"},
    {"bench", epyq_cmd_bench, "llama-bench style throughput benchmark"},
    {"ppl", epyq_cmd_ppl, "perplexity / KL divergence over a text file"},
    {"inspect", epyq_cmd_inspect, "validate and summarise a checkpoint folder"},
    {"synth", epyq_cmd_synth, "write a synthetic checkpoint of the real shape"},
    {"logits", epyq_cmd_logits, "conformance: write float32 logits for given ids"},
    {"tokenize", epyq_cmd_tokenize, "text -> token ids (JSON)"},
    {"detokenize", epyq_cmd_detokenize, "token ids (JSON) -> text"},
    {"template", epyq_cmd_template, "render the checkpoint's chat template"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: epyq <command> [options]   (epyq <command> --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s%s\n", commands[i].name, commands[i].help,
                commands[i].fn ? "" : "  [not built]");
    fprintf(f, "\nepyq %s — CPU inference for Qwen3.6-35B-A3B (int4 W4A16 / BF16)\n", PACKAGE_VERSION);
}

int main(int argc, char **argv) {
#ifdef __GLIBC__
    /* A forward pass allocates its activations per block and frees them again (a 512-token
     * prefill: ~40 MB for the MoE block's expert outputs alone). glibc serves blocks above its
     * mmap threshold (at most 32 MiB, adjusted dynamically) with fresh mappings and trims the
     * heap top past twice that, so every layer of every forward took new pages from the kernel,
     * zeroed: a 4-layer 35b-a3b pp512 forward took 74k page faults (290 MB zeroed). Kept in the
     * heap, they are reused; epyq_model_free still trims everything (malloc_trim). */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("epyq %s\n", PACKAGE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        if (!commands[i].fn) {
            fprintf(stderr, "epyq: command '%s' is not built into this binary\n", argv[1]);
            return 2;
        }
        /* Each command reports a bad option in its own single line (usage errors are one
         * line, conventions §2), so getopt must not print a second one. */
        opterr = 0;
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "epyq: unknown command '%s' (try epyq --help)\n", argv[1]);
    return 2;
}
