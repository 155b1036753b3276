/* tools/chat_repl.h — the state of `epyq chat`'s REPL, shared by tools/cmd_chat.c (the loop,
 * commands, streaming) and tools/chat_state.c (prompt reuse across turns, session files). */
#ifndef EPYQ_TOOLS_CHAT_REPL_H
#define EPYQ_TOOLS_CHAT_REPL_H

#include <cjson/cJSON.h>

#include "chat/chat.h"
#include "chat/reasoning.h"
#include "engine/prefix.h"
#include "tok/sbuf.h"
#include "tools/gen.h"
#include "vision/vision.h"

/* One image of the conversation (/image FILE), encoded once when attached. */
typedef struct {
    float *rows;     /* [tokens][out_hidden] the tower's output */
    int32_t tokens;  /* its <|image_pad|> run */
    int32_t grid[2]; /* patch grid gh, gw */
} chat_img;

typedef struct {
    epyq_chat *tmpl;
    const epyq_tok *tok;
    epyq_gen gen;
    cJSON *msgs; /* [{role, content[, reasoning_content]}], system first when set */
    bool think, tty_in, tty_out;
    int n_predict;
    int32_t *held; /* [ctx] ids the sequence was fed, in order */
    int32_t n_held;
    int32_t *gen_ids; /* [n_predict] */
    char *pending;    /* /read text for the next user message, or NULL */
    epyq_gen_stats last;
    uint64_t seed, n_answers; /* -s and the answers started so far */
    /* prompt reuse (issue 15): copies of the state at prompt checkpoints, NULL with
     * --cache-mb 0; what the last answer's prompt restored and how long its first token took */
    epyq_prefix *cache;
    uint64_t model_id;   /* epyq_model_identity, for session files */
    const char *session; /* --session FILE: saved after every answer */
    epyq_kv_type kv;
    int32_t last_cached;
    double last_ttft, last_restore_s;
    uint64_t total_cached, total_computed;
    /* images (tools/chat_image.c): the tower, loaded at the first /image from dir; every image
     * of the conversation in the order of its pads, the last n_pending of them waiting for
     * the next user message; the current prompt's rows and M-RoPE positions for gen.img */
    const char *dir;
    int32_t threads;
    epyq_vision *vision;
    chat_img *imgs;
    int32_t n_imgs, n_pending;
    const float **img_embd; /* [prompt tokens] */
    int32_t *img_pos;       /* [prompt tokens][3] */
    epyq_batch_img bimg;
    /* streaming state of the current answer */
    epyq_reasoning *rp;
    epyq_sbuf reasoning, content;
    bool in_think_shown;
} repl;

/* Prompt ids of msgs (the whole history when msgs is r->msgs) with or without the generation
 * prompt; *prompt gets the rendered text when non-NULL. */
epyq_status chat_render(const repl *r, const cJSON *msgs, bool gen_prompt, char **prompt,
                        int32_t **ids, size_t *n_ids, epyq_err *err);
/* Put the sequence at the longest reusable prefix of ids[0, n_ids) — what it holds already,
 * or a cached copy — and set the checkpoints this prompt's prefill copies (where the next
 * turn's prompt can part from this one). Returns the position the prefill starts from. */
size_t chat_prepare(repl *r, const int32_t *ids, size_t n_ids);
/* /image FILE: decode and encode FILE now, for the next user message. */
epyq_status chat_image_add(repl *r, const char *path, epyq_err *err);
/* The user message msg (string content) gets the pending images as content parts before its
 * text; returns how many. */
int32_t chat_image_attach(repl *r, cJSON *msg);
/* Forget the last n images (a turn that got no answer), or all of them (n < 0). */
void chat_image_drop(repl *r, int32_t n);
/* With images in the conversation: *ids [*n] (one pad per image, as rendered) expanded to the
 * images' runs and gen.img set to their rows and positions; without, gen.img = NULL. */
epyq_status chat_image_prompt(repl *r, int32_t **ids, size_t *n, epyq_err *err);
/* Session files (src/engine/session.h). Save first brings the sequence to the end of the
 * rendered history that every next prompt starts with, so a loaded session continues by
 * computing only the next message. Load replaces the conversation and the state, or changes
 * nothing and says which field of which file was wrong. */
epyq_status chat_session_save(repl *r, const char *path, epyq_err *err);
epyq_status chat_session_load(repl *r, const char *path, epyq_err *err);
/* The conversation as JSON text ({"messages": [...], "enable_thinking": b}); parse refuses
 * anything else, naming `what` (the file) in the message. */
char *chat_conv_json(const repl *r);
epyq_status chat_conv_parse(const char *what, const char *text, size_t len, cJSON **msgs,
                            bool *think, epyq_err *err);

#endif
