/* src/chat/jinja_int.h — shared internals of the chat-template interpreter (not a public API).
 *
 * Promise: one set of types for the lexer (jinja_lex.c), parser (jinja_parse.c), values
 * (jinja_value.c, jinja_str.c), evaluator (jinja_eval.c, jinja_ops.c) and built-ins
 * (jinja_filters.c, jinja_tests.c, jinja_methods.c). Everything a template or a render allocates
 * lives in an arena with a byte cap, so a hostile template ends in an error, never in unbounded
 * memory. */
#ifndef EPYQ_JINJA_INT_H
#define EPYQ_JINJA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "chat/jinja.h"
#include "core/status.h"
#include "tok/sbuf.h"

/* ---- arena ------------------------------------------------------------------------------ */

typedef struct jj_chunk jj_chunk;
typedef struct {
    jj_chunk *head;   /* newest chunk first */
    size_t used;      /* bytes handed out so far (all chunks) */
    size_t max;       /* cap on used; 0 = none */
} jj_arena;

void *epyq_jj_alloc(jj_arena *a, size_t n); /* zeroed, 16-byte aligned; NULL past the cap */
void *epyq_jj_alloc_array(jj_arena *a, size_t n, size_t size);
char *epyq_jj_strdup(jj_arena *a, const char *s, size_t n); /* NUL-terminated copy */
void epyq_jj_arena_free(jj_arena *a);

/* ---- values ----------------------------------------------------------------------------- */

typedef enum {
    JV_UNDEF,  /* jinja2 Undefined: prints "", iterates empty, errors in arithmetic */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,   /* also tuples (flag) */
    JV_DICT,
    JV_NS,     /* namespace(): the one mutable object a template may change */
    JV_MACRO,
    JV_FUNC,   /* a built-in global or a method bound to its receiver */
    JV_LOOP,   /* the `loop` object of a for loop */
} jv_type;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct {
    uint8_t t;     /* jv_type */
    uint8_t tuple; /* JV_LIST: a tuple (only repr/equality differ) */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; /* not NUL-terminated in general; for JV_UNDEF: the missing name */
            size_t n;      /* bytes */
        } s;
        jlist *l;
        jdict *d;
        jmacro *m;
        jfunc *fn;
        jloop *loop;
    } u;
} jv;

struct jlist {
    size_t n, cap;
    jv *v; /* [cap] */
};

struct jdict {
    size_t n, cap;
    jv *k; /* [cap] keys, insertion order */
    jv *v; /* [cap] values */
};

/* ---- AST -------------------------------------------------------------------------------- */

typedef enum {
    /* expressions */
    JN_LIT, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL,
    JN_FILTER, JN_TEST, JN_NOT, JN_NEG, JN_POS, JN_BIN, JN_AND, JN_OR, JN_COND, JN_CMP,
    /* statements */
    JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_BREAK, JN_CONTINUE,
    JN_BLOCK, /* a body with no effect of its own ({% generation %}) */
} jn_kind;

/* Binary and comparison operators (JN_BIN op / JN_CMP ops). */
typedef enum {
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
} jop;

typedef struct jnode jnode;
struct jnode {
    uint8_t kind;      /* jn_kind */
    uint8_t op;        /* JN_BIN: jop; JN_TEST: 1 = `is not`; JN_FOR: 1 = has a filter */
    int line, col;     /* where the construct starts in the template (1-based) */
    const char *name;  /* NAME/ATTR/FILTER/TEST/MACRO/SET target (NUL-terminated) */
    const char *attr;  /* JN_SET: `ns.attr` target attribute, else NULL */
    int fid;           /* JN_FILTER/JN_TEST: built-in index */
    jv lit;            /* JN_LIT / JN_TEXT value */
    jnode **kids;      /* [nkids] operands; CALL: callee then args; FILTER/TEST: subject then args */
    const char **argnames; /* [nkids] keyword names of call/filter args (NULL = positional);
                            * MACRO: parameter names with kids = defaults (NULL = none);
                            * FOR/SET: target names */
    size_t nkids;
    size_t nnames;     /* FOR/SET: number of target names */
    jnode **body;      /* [nbody] statements */
    size_t nbody;
    jnode **orelse;    /* [norelse] IF else branch / FOR else branch */
    size_t norelse;
    uint8_t *ops;      /* JN_CMP: [nkids-1] comparison operators */
};

struct epyq_jinja {
    jj_arena ar;      /* the whole AST and its strings */
    jnode **body;     /* [nbody] top-level statements */
    size_t nbody;
    char name[64];    /* used in messages, e.g. "chat_template" */
};

/* ---- lexer ------------------------------------------------------------------------------ */

typedef enum {
    JT_EOF, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP,
} jt_kind;

typedef struct {
    uint8_t kind; /* jt_kind */
    int line, col;
    const char *p; /* TEXT/NAME/STRING: arena bytes (STRING already unescaped); OP: spelling */
    size_t n;
    int64_t i;
    double f;
} jtok;

/* Tokenizes src (already newline-normalised by the caller) with jinja2's whitespace control
 * as transformers configures it (trim_blocks, lstrip_blocks, `-`/`+` modifiers). */
epyq_status epyq_jj_lex(jj_arena *a, const char *src, size_t len, const char *name, jtok **toks,
                   size_t *ntoks, epyq_err *err);

/* ---- built-ins (names resolved at parse time) ------------------------------------------ */

int epyq_jj_filter_id(const char *name); /* -1 when unknown */
int epyq_jj_test_id(const char *name);   /* -1 when unknown */

/* ---- render ----------------------------------------------------------------------------- */

typedef struct jscope jscope;
struct jscope {
    jscope *parent;
    size_t n, cap;
    const char **names; /* [cap] */
    jv *vals;           /* [cap] */
};

typedef struct {
    jj_arena ar;           /* values made while rendering */
    epyq_err *err;
    const epyq_jinja *tpl;
    uint64_t steps, max_steps;
    int depth;             /* macro/filter call nesting */
    size_t max_output;
    const jnode *at;       /* node being evaluated, for error positions */
} jrender;

struct jmacro {
    const jnode *def;
    jscope *closure;
};

/* A built-in global or method: id is a JF_* value, self the receiver for methods. */
struct jfunc {
    int id;
    jv self;
};

struct jloop {
    jlist *items;
    size_t idx;
    jloop *outer;
};

/* Errors: fill r->err with "<template>:line:col: <message>" and return false. */
bool epyq_jj_fail(jrender *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool epyq_jj_nomem(jrender *r);

/* Constructors. */
static inline jv jv_undef(const char *name) {
    jv v = {.t = JV_UNDEF};
    v.u.s.p = name;
    v.u.s.n = name ? __builtin_strlen(name) : 0;
    return v;
}
static inline jv jv_none(void) { return (jv){.t = JV_NONE}; }
static inline jv jv_bool(bool b) { return (jv){.t = JV_BOOL, .u.b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
static inline jv jv_float(double f) { return (jv){.t = JV_FLOAT, .u.f = f}; }
static inline jv jv_str(const char *p, size_t n) {
    jv v = {.t = JV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline jv jv_list(jlist *l, bool tuple) {
    jv v = {.t = JV_LIST, .tuple = tuple};
    v.u.l = l;
    return v;
}
/* Python's numeric tower: bool is an int, int and float are numbers. */
static inline bool jv_is_intlike(jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static inline int64_t jv_as_int(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }
static inline bool jv_is_num(jv v) { return jv_is_intlike(v) || v.t == JV_FLOAT; }
static inline double jv_as_f(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)jv_as_int(v); }
jlist *epyq_jj_list_new(jj_arena *a, size_t cap);
bool epyq_jj_list_push(jj_arena *a, jlist *l, jv v);
jdict *epyq_jj_dict_new(jj_arena *a, size_t cap);
/* Insert or replace (Python dict assignment: a replaced key keeps its position). */
bool epyq_jj_dict_set(jj_arena *a, jdict *d, jv k, jv v);
/* The value under a string key, or NULL. */
jv *epyq_jj_dict_get_str(const jdict *d, const char *k, size_t n);
jv *epyq_jj_dict_get(const jdict *d, jv k);
jv epyq_jj_from_cjson(jrender *r, const cJSON *x, int depth, bool *ok);

/* Python semantics. */
bool epyq_jj_truthy(jv v);
bool epyq_jj_equal(jv a, jv b);
/* -1/0/1 into *cmp; false (error set) when the types do not order (Python TypeError). */
bool epyq_jj_compare(jrender *r, jv a, jv b, int *cmp);
const char *epyq_jj_type_name(jv v); /* Python type name for messages: 'str', 'int', 'dict' … */
/* str(v) / repr(v) appended to b; false on the output cap. */
bool epyq_jj_to_str(epyq_sbuf *b, jv v);
bool epyq_jj_repr(epyq_sbuf *b, jv v);
/* str(v) as an arena string value. */
bool epyq_jj_stringify(jrender *r, jv v, jv *out);
/* json.dumps(v, ensure_ascii=False, indent, sort_keys) as transformers' tojson does. */
bool epyq_jj_tojson(jrender *r, epyq_sbuf *b, jv v, int indent, bool sort_keys);
/* A new arena string holding b's bytes. */
bool epyq_jj_str_from_buf(jrender *r, epyq_sbuf *b, jv *out);
bool epyq_jj_count_step(jrender *r);

/* Strings (UTF-8, indexed by code point as Python does). */
size_t epyq_jj_utf8_len(const char *s, size_t n);
/* Byte offset of code point index cp (clamped to n). */
size_t epyq_jj_utf8_offset(const char *s, size_t n, size_t cp);
/* Decodes one code point at s[*i] (advancing *i); invalid bytes decode as themselves. */
uint32_t epyq_jj_utf8_next(const char *s, size_t n, size_t *i);
bool epyq_jj_py_isspace(uint32_t c); /* Python str.isspace() for one code point */
/* str.strip/lstrip/rstrip: chars == NULL means whitespace. which: 1 left, 2 right, 3 both. */
jv epyq_jj_str_strip(jv s, const char *chars, size_t nchars, int which);

/* ---- evaluation ------------------------------------------------------------------------- */

bool epyq_jj_eval(jrender *r, jscope *sc, const jnode *n, jv *out);
/* Calls a callable value (macro, built-in, method) with evaluated arguments. */
bool epyq_jj_call_value(jrender *r, jv fn, const jv *args, const char *const *names, size_t nargs,
                   jv *out);
/* Operators on values (jinja_ops.c): Python's semantics and TypeError messages. */
bool epyq_jj_undefined_error(jrender *r, jv u); /* "'name' is undefined" */
bool epyq_jj_slice(jrender *r, jv obj, jv start, jv stop, jv step, jv *out);
bool epyq_jj_binary(jrender *r, jop op, jv a, jv b, jv *out);
bool epyq_jj_compare_op(jrender *r, jop op, jv a, jv b, bool *out);
/* attribute / item access with jinja2's getattr/getitem rules. */
bool epyq_jj_getattr(jrender *r, jv obj, const char *name, jv *out);
bool epyq_jj_getitem(jrender *r, jv obj, jv key, jv *out);
/* Filters and tests: args[0] is the subject. */
bool epyq_jj_apply_filter(jrender *r, jscope *sc, int fid, const jv *args, const char *const *names,
                     size_t nargs, jv *out);
bool epyq_jj_apply_test(jrender *r, int tid, const jv *args, size_t nargs, bool *out);
/* Case mapping of a string value, one code point at a time (lower/upper/capitalize/title
 * filters, unique's and sort's case-insensitive keys, the lower/upper tests). */
enum { JJ_CASE_LOWER, JJ_CASE_UPPER, JJ_CASE_CAPITALIZE, JJ_CASE_TITLE };
bool epyq_jj_map_case(jrender *r, jv s, int mode, jv *out);
/* Methods of str/dict/list/loop and the globals (range, namespace, raise_exception …). */
bool epyq_jj_method(jrender *r, jv self, const char *name, jv *out); /* false + undef when none */
bool epyq_jj_call_builtin(jrender *r, const jfunc *f, const jv *args, const char *const *names,
                     size_t nargs, jv *out);
void epyq_jj_install_globals(jrender *r, jscope *sc);
/* Iterate: list/tuple items, dict keys, string characters; undefined = empty. */
bool epyq_jj_iter_list(jrender *r, jv v, jlist **out);

#endif
