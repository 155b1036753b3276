/* src/engine/session.h — a chat session file (issue 15): the conversation and a sequence
 * state that a later run restores instead of recomputing the prompt.
 *
 * Layout (little-endian, as the x86-64 hosts epyq runs on write it):
 *   0  magic "EPYQSESS"             8  u32 version (1)          12 u32 header bytes (80)
 *   16 u64 model identity (epyq_model_identity)                  24 i32 KV type
 *   28 i32 context                  32 i32 tokens held (n_ids)  36 u32 reserved (0)
 *   40 u64 conversation bytes       48 u64 snapshot bytes
 *   56 u64 body checksum            64 u64 header checksum (of bytes 0..63)  72 8 zero bytes
 *   body: i32 ids[n_ids] | conversation JSON | detached snapshot (epyq_seq_snapshot_detach)
 * Reading checks, in order: the length against the header size, magic, version, header
 * checksum, the file length against the sizes the header gives, then the identity (model,
 * KV type, context) and the body checksum, before anything is returned. Whether the snapshot
 * fits the sequence is left to epyq_seq_restore_detached, which checks every size again.
 * The file is written with epyq_file_write_atomic (temp file, fsync, rename): a run killed
 * while saving leaves the old file or the new one, never half of one. */
#ifndef EPYQ_SESSION_H
#define EPYQ_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#define EPYQ_SESSION_VERSION 1u

typedef struct {
    uint64_t model_id;
    int32_t kv_type, n_ctx;
} epyq_session_id;

typedef struct {
    epyq_session_id id;
    const int32_t *ids; /* the tokens the snapshot has consumed */
    int32_t n_ids;
    const char *conv; /* conversation JSON (not NUL-terminated in the file) */
    uint64_t conv_len;
    const void *snap; /* detached, taken at position n_ids */
    uint64_t snap_len;
} epyq_session;

epyq_status epyq_session_write(const char *path, const epyq_session *s, epyq_err *err);
/* On success *out's pointers point into *blob (the caller frees it); on failure nothing is
 * returned and err names the file and the field that did not match. */
epyq_status epyq_session_read(const char *path, const epyq_session_id *want, epyq_session *out,
                              void **blob, epyq_err *err);
/* True when the file starts with the session magic (a JSON conversation does not). */
bool epyq_session_sniff(const char *path);

#endif
