/* src/load/safetensors.c — safetensors header parsing and validation (docs/architecture.md §3.1).
 * The sharded-folder logic (index, mmap, cross-shard checks) lives in ckpt.c. */
#include "load/safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/json.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[EPYQ_DT_COUNT] = {
    [EPYQ_DT_BOOL] = {"BOOL", 1},       [EPYQ_DT_U8] = {"U8", 1},     [EPYQ_DT_I8] = {"I8", 1},
    [EPYQ_DT_F8_E5M2] = {"F8_E5M2", 1}, [EPYQ_DT_F8_E4M3] = {"F8_E4M3", 1},
    [EPYQ_DT_I16] = {"I16", 2},         [EPYQ_DT_U16] = {"U16", 2},   [EPYQ_DT_F16] = {"F16", 2},
    [EPYQ_DT_BF16] = {"BF16", 2},       [EPYQ_DT_I32] = {"I32", 4},   [EPYQ_DT_U32] = {"U32", 4},
    [EPYQ_DT_F32] = {"F32", 4},         [EPYQ_DT_F64] = {"F64", 8},   [EPYQ_DT_I64] = {"I64", 8},
    [EPYQ_DT_U64] = {"U64", 8},
};

size_t epyq_dtype_size(epyq_dtype dt) { return (unsigned)dt < EPYQ_DT_COUNT ? dtypes[dt].size : 0; }
const char *epyq_dtype_name(epyq_dtype dt) { return (unsigned)dt < EPYQ_DT_COUNT ? dtypes[dt].name : "?"; }

int epyq_dtype_parse(const char *s) {
    for (int i = 0; i < EPYQ_DT_COUNT; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

void epyq_st_header_free(epyq_st_header *h) {
    if (!h) return;
    free(h->t);
    free(h->names);
    memset(h, 0, sizeof *h);
}

/* Byte range of one tensor inside the data section; kept beside t[] only while sorting. */
typedef struct {
    uint64_t begin, end;
    size_t idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Fill t from one header entry {"dtype", "shape", "data_offsets"}; b and e get the offsets. */
static epyq_status parse_entry(epyq_tensor *t, uint64_t *b, uint64_t *e, const cJSON *ent, const char *label,
                               epyq_err *err) {
    const char *nm = ent->string;
    if (!cJSON_IsObject(ent))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: expected an object, found %s", label, nm,
                            epyq_json_type_name(ent));
    const cJSON *dt = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *c = ent->child; c; c = c->next) {
        if (!strcmp(c->string, "dtype")) dt = c;
        else if (!strcmp(c->string, "shape")) shape = c;
        else if (!strcmp(c->string, "data_offsets")) offs = c;
        else
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: unknown field \"%.64s\"", label, nm, c->string);
    }
    if (!cJSON_IsString(dt))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: dtype: expected a string, found %s", label, nm,
                            epyq_json_type_name(dt));
    int d = epyq_dtype_parse(dt->valuestring);
    if (d < 0)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: unknown dtype \"%.32s\"", label, nm, dt->valuestring);
    t->dtype = (epyq_dtype)d;
    if (!cJSON_IsArray(shape))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: shape: expected an array, found %s", label, nm,
                            epyq_json_type_name(shape));
    int nd = cJSON_GetArraySize(shape);
    if (nd > EPYQ_ST_MAX_DIMS)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: %d dimensions, at most %d supported", label, nm, nd,
                            EPYQ_ST_MAX_DIMS);
    t->ndim = nd;
    size_t count = 1;
    int i = 0;
    bool overflow = false;
    for (const cJSON *c = shape->child; c; c = c->next, i++) {
        int64_t v;
        if (!epyq_json_as_int(c, 0, EPYQ_JSON_INT_MAX, &v))
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: shape[%d]: expected a non-negative integer",
                                label, nm, i);
        t->shape[i] = v;
        if (!epyq_mul_size(count, (size_t)v, &count)) overflow = true;
    }
    size_t nbytes;
    if (overflow || !epyq_mul_size(count, epyq_dtype_size(t->dtype), &nbytes))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: shape × dtype size overflows (ValidationOverflow)",
                            label, nm);
    int64_t ob, oe;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !epyq_json_as_int(offs->child, 0, EPYQ_JSON_INT_MAX, &ob) ||
        !epyq_json_as_int(offs->child->next, 0, EPYQ_JSON_INT_MAX, &oe))
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: tensor %s: data_offsets: expected [begin, end] of non-negative integers", label, nm);
    if (oe < ob)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: data_offsets end %lld < begin %lld (InvalidOffset)",
                            label, nm, (long long)oe, (long long)ob);
    if ((uint64_t)(oe - ob) != (uint64_t)nbytes)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: tensor %s: data_offsets span %lld bytes, shape × %s needs %zu (TensorInvalidInfo)",
                            label, nm, (long long)(oe - ob), epyq_dtype_name(t->dtype), nbytes);
    t->nbytes = nbytes;
    *b = (uint64_t)ob;
    *e = (uint64_t)oe;
    return EPYQ_OK;
}

static epyq_status check_metadata(const cJSON *m, const char *label, epyq_err *err) {
    if (!cJSON_IsObject(m))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: __metadata__: expected an object, found %s", label,
                            epyq_json_type_name(m));
    for (const cJSON *c = m->child; c; c = c->next)
        if (!cJSON_IsString(c))
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: __metadata__.%.64s: expected a string, found %s", label,
                                c->string, epyq_json_type_name(c));
    return EPYQ_OK;
}

epyq_status epyq_st_parse(epyq_st_header *out, const uint8_t *buf, size_t len, uint64_t file_size,
                          const char *label, epyq_err *err) {
    memset(out, 0, sizeof *out);
    if (file_size < 8 || len < 8)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: file is %llu bytes, a safetensors file needs at least 8 (HeaderTooSmall)",
                            label, (unsigned long long)(file_size < len ? file_size : len));
    uint64_t n = le64(buf);
    if (n > EPYQ_ST_HEADER_MAX)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: header claims %llu bytes, limit is %u (HeaderTooLarge)", label,
                            (unsigned long long)n, EPYQ_ST_HEADER_MAX);
    if (n > file_size - 8)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: header claims %llu bytes but only %llu follow the length field (InvalidHeaderLength)",
                            label, (unsigned long long)n, (unsigned long long)(file_size - 8));
    if (n > len - 8)
        return epyq_err_set(err, EPYQ_E_IO, "%s: only %zu bytes of the %llu-byte header are available", label,
                            len - 8, (unsigned long long)n);
    cJSON *root;
    epyq_status st = epyq_json_parse(&root, (const char *)buf + 8, (size_t)n, label, err);
    if (st) return st;

    size_t cnt = 0, name_bytes = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!strcmp(c->string, "__metadata__")) {
            if ((st = check_metadata(c, label, err))) goto fail;
            continue;
        }
        size_t l = strlen(c->string);
        if (l == 0 || l > EPYQ_ST_NAME_MAX) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor name of %zu bytes (allowed 1..%u): \"%.64s\"", label, l,
                              EPYQ_ST_NAME_MAX, c->string);
            goto fail;
        }
        if (++cnt > EPYQ_ST_MAX_TENSORS) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: more than %u tensors", label, EPYQ_ST_MAX_TENSORS);
            goto fail;
        }
        name_bytes += l + 1; /* bounded by the header size, which is capped */
    }
    span *sp = NULL;
    if (cnt) {
        out->t = calloc(cnt, sizeof *out->t);
        out->names = malloc(name_bytes);
        sp = malloc(cnt * sizeof *sp);
        if (!out->t || !out->names || !sp) {
            free(sp);
            st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory for %zu tensors", label, cnt);
            goto fail;
        }
    }
    size_t k = 0, np = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!strcmp(c->string, "__metadata__")) continue;
        epyq_tensor *t = &out->t[k];
        if ((st = parse_entry(t, &sp[k].begin, &sp[k].end, c, label, err))) {
            free(sp);
            goto fail;
        }
        size_t l = strlen(c->string) + 1;
        memcpy(out->names + np, c->string, l);
        sp[k].idx = k;
        k++;
        np += l;
    }
    /* Names point into out->names; fill them after the copy loop so the pointers are final. */
    np = 0;
    for (size_t i = 0; i < cnt; i++) {
        out->t[i].name = out->names + np;
        np += strlen(out->names + np) + 1;
    }
    if (cnt) qsort(sp, cnt, sizeof *sp, cmp_span); /* sp is NULL for an empty header */
    uint64_t pos = 0;
    for (size_t i = 0; i < cnt; i++) {
        if (sp[i].begin != pos) {
            const char *nm = out->t[sp[i].idx].name;
            st = epyq_err_set(err, EPYQ_E_FORMAT, sp[i].begin > pos
                    ? "%s: tensor %s: data begins at %llu, previous tensor ends at %llu (gap; InvalidOffset)"
                    : "%s: tensor %s: data begins at %llu, inside the previous tensor ending at %llu (overlap; InvalidOffset)",
                    label, nm, (unsigned long long)sp[i].begin, (unsigned long long)pos);
            free(sp);
            goto fail;
        }
        pos = sp[i].end;
    }
    uint64_t data_start = 8 + n;
    if (pos != file_size - data_start) {
        st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensors end at data byte %llu, file holds %llu data bytes (MetadataIncompleteBuffer)",
                          label, (unsigned long long)pos, (unsigned long long)(file_size - data_start));
        free(sp);
        goto fail;
    }
    /* Return tensors in data order; data pointers only where the caller's buffer covers them. */
    epyq_tensor *sorted = cnt ? malloc(cnt * sizeof *sorted) : NULL;
    if (cnt && !sorted) {
        free(sp);
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
        goto fail;
    }
    for (size_t i = 0; i < cnt; i++) {
        sorted[i] = out->t[sp[i].idx];
        sorted[i].data = sp[i].end <= len - data_start ? buf + data_start + sp[i].begin : NULL;
        sorted[i].shard = 0;
    }
    free(sp);
    free(out->t);
    out->t = sorted;
    out->n = cnt;
    out->header_len = n;
    out->data_start = data_start;
    out->data_len = pos;
    cJSON_Delete(root);
    return EPYQ_OK;
fail:
    cJSON_Delete(root);
    epyq_st_header_free(out);
    return st;
}

/* ---- model.safetensors.index.json ---- */

void epyq_st_index_free(epyq_st_index *ix) {
    if (!ix) return;
    for (size_t i = 0; i < ix->n; i++) {
        free(ix->names[i]);
        free(ix->files[i]);
    }
    free(ix->names);
    free(ix->files);
    memset(ix, 0, sizeof *ix);
}

/* A shard reference must be a plain file name inside the folder: no path tricks. */
static bool shard_name_ok(const char *f) {
    size_t l = strlen(f);
    return l > 0 && l <= 255 && f[0] != '.' && !strchr(f, '/') && !strchr(f, '\\');
}

typedef struct {
    const char *name, *file;
} ix_pair;

static int cmp_pair(const void *a, const void *b) { return strcmp(((const ix_pair *)a)->name, ((const ix_pair *)b)->name); }

epyq_status epyq_st_index_parse(epyq_st_index *out, const char *json, size_t len, const char *label, epyq_err *err) {
    memset(out, 0, sizeof *out);
    cJSON *root;
    epyq_status st = epyq_json_parse(&root, json, len, label, err);
    if (st) return st;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    ix_pair *p = NULL;
    if (!cJSON_IsObject(wm)) {
        st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: weight_map: expected an object, found %s", label,
                          epyq_json_type_name(wm));
        goto done;
    }
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (md && !cJSON_IsObject(md) && !cJSON_IsNull(md)) {
        st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: metadata: expected an object, found %s", label,
                          epyq_json_type_name(md));
        goto done;
    }
    size_t n = 0;
    for (const cJSON *c = wm->child; c; c = c->next) {
        size_t l = strlen(c->string);
        if (l == 0 || l > EPYQ_ST_NAME_MAX) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: weight_map: tensor name of %zu bytes (allowed 1..%u)", label, l,
                              EPYQ_ST_NAME_MAX);
            goto done;
        }
        if (!cJSON_IsString(c) || !shard_name_ok(c->valuestring)) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: weight_map[%s]: expected a shard file name in this folder, found %s",
                              label, c->string, cJSON_IsString(c) ? "a path" : epyq_json_type_name(c));
            goto done;
        }
        if (++n > EPYQ_ST_MAX_TENSORS) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: weight_map lists more than %u tensors", label, EPYQ_ST_MAX_TENSORS);
            goto done;
        }
    }
    if (n == 0) {
        st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: weight_map is empty", label);
        goto done;
    }
    p = malloc(n * sizeof *p);
    out->names = calloc(n, sizeof *out->names);
    out->files = calloc(n, sizeof *out->files);
    if (!p || !out->names || !out->files) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    size_t k = 0;
    for (const cJSON *c = wm->child; c; c = c->next, k++) p[k] = (ix_pair){c->string, c->valuestring};
    qsort(p, n, sizeof *p, cmp_pair);
    for (k = 0; k < n; k++) {
        out->names[k] = strdup(p[k].name);
        out->files[k] = strdup(p[k].file);
        out->n = k + 1;
        if (!out->names[k] || !out->files[k]) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
    }
done:
    free(p);
    cJSON_Delete(root);
    if (st) epyq_st_index_free(out);
    return st;
}
