/* tests/fuzz/fuzz_config.c — libFuzzer harness for config.json + generation_config.json +
 * quantization_config. Input: config text, optionally a NUL byte and generation_config text,
 * optionally another NUL and a quantize_config.json text. On success the module rules are
 * queried for a few names (exercises the regex/glob/substring matchers). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "load/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 2);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = buf[size + 1] = '\0';
    const char *parts[3] = {buf, NULL, NULL};
    size_t at = strlen(buf);
    for (int k = 1; k < 3 && at < size; k++) {
        parts[k] = buf + at + 1;
        at += 1 + strlen(parts[k]);
    }
    epyq_config cfg;
    epyq_err err;
    if (epyq_config_parse(&cfg, parts[0], parts[1], parts[2], "fuzz/config.json", &err) == EPYQ_OK) {
        static const char *mods[] = {"lm_head", "model.language_model.layers.0.mlp.gate",
                                     "model.language_model.layers.3.self_attn.q_proj",
                                     "model.language_model.layers.1.mlp.experts.7.down_proj", "mtp.fc", ""};
        for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) (void)epyq_qconfig_for(&cfg, mods[i]);
        epyq_config_free(&cfg);
    }
    free(buf);
    return 0;
}
