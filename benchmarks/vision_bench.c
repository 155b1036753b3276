/* benchmarks/vision_bench.c — vision encoding time: square test images of the given sides through
 * the processor and the runtime tower of a checkpoint (e.g. `epyq synth --shape 35b-a3b --layers
 * 1`, which carries the full-size BF16 tower), with GFLOP/s over the tower's multiply-adds
 * (epyq_vision_flops x 2). Each size runs once untimed, then `reps` timed runs; the best is
 * printed (one JSON line per size).
 * usage: benchmarks/vision_bench DIR [THREADS] [SIDE...]   (default: 2 threads, 448 and 1024);
 * EPYQ_BENCH_REPS=N timed runs (default 2; 0 = time the first run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "vision/preproc.h"
#include "vision/vision.h"

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: %s DIR [THREADS] [SIDE...]\n", argv[0]), 2;
    int threads = argc > 2 ? atoi(argv[2]) : 2, reps = 2;
    const char *re =
        getenv("EPYQ_BENCH_REPS"); /* timed runs after the untimed one (0: time that one) */
    if (re && *re) reps = atoi(re);
    int sides[16] = {448, 1024}, n_sides = 2;
    if (argc > 3) {
        n_sides = 0;
        for (int i = 3; i < argc && n_sides < 16; i++) sides[n_sides++] = atoi(argv[i]);
    }
    epyq_err err = {0};
    epyq_vision *v = NULL;
    epyq_vision_opts vo = {.n_threads = threads};
    double t0 = epyq_now();
    if (epyq_kern_init(&err) != EPYQ_OK || epyq_vision_load(&v, argv[1], &vo, &err) != EPYQ_OK)
        return fprintf(stderr, "vision: %s\n", err.msg), 1;
    const epyq_vision_config *c = epyq_vision_cfg(v);
    fprintf(stderr, "tower: depth %d, hidden %d, heads %d, loaded in %.2f s, kernels %s\n",
            c->depth, c->hidden, c->heads, epyq_now() - t0, epyq_kern()->name);
    for (int s = 0; s < n_sides; s++) {
        int w = sides[s], h = sides[s];
        epyq_image im = {w, h, malloc((size_t)w * h * 3)};
        for (size_t i = 0; i < (size_t)w * h * 3; i++)
            im.rgb[i] = (uint8_t)((i * 2654435761u) >> 24);
        epyq_vision_input in;
        if (epyq_vision_prepare(epyq_vision_preproc(v), &im, "bench", &in, &err) != EPYQ_OK)
            return fprintf(stderr, "vision: %s\n", err.msg), 1;
        int32_t tok = epyq_vision_tokens(c, in.gh, in.gw);
        float *out = malloc((size_t)tok * c->out_hidden * sizeof(float));
        double best = 1e30;
        for (int r = 0; r <= reps; r++) {
            double a = epyq_now();
            if (epyq_vision_encode(v, &in, 1, out, &err) != EPYQ_OK)
                return fprintf(stderr, "vision: %s\n", err.msg), 1;
            double dt = epyq_now() - a;
            if ((r > 0 || reps == 0) && dt < best) best = dt; /* run 0 warms caches and pages */
        }
        double gf = epyq_vision_flops(c, in.n) / best / 1e9;
        printf(
            "{\"image\": \"%dx%d\", \"resized\": \"%dx%d\", \"patches\": %d, \"tokens\": %d, \"threads\": %d, "
            "\"seconds\": %.3f, \"gflop\": %.1f, \"gflop_per_s\": %.1f}\n",
            w, h, in.w, in.h, in.n, tok, threads, best, epyq_vision_flops(c, in.n) / 1e9, gf);
        fflush(stdout);
        free(out), free(im.rgb);
        epyq_vision_input_free(&in);
    }
    epyq_vision_free(v);
    return 0;
}
