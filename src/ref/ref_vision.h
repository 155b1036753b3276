/* src/ref/ref_vision.h — the plain-C float64 twin of the vision tower (docs/vision.md §3).
 *
 * Promise: a literal transcription, one image at a time, with every weight widened exactly from
 * its stored dtype and every activation, norm, rotary angle, softmax and sum in double. It shares
 * nothing with src/vision/tower.c beyond the binding (epyq_vision_bind), so the two test each
 * other; it is slow (no blocking, O(n^2) attention) and meant for small towers and images. */
#ifndef EPYQ_REF_VISION_H
#define EPYQ_REF_VISION_H

#include "vision/vision.h"

/* out [tokens][out_hidden] for one image (tokens = (gh/merge) * (gw/merge)). */
epyq_status epyq_ref_vision_encode(const epyq_vision_w *w, const epyq_vision_input *in, double *out,
                                   epyq_err *err);

#endif
