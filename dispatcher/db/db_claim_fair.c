/* db_claim_fair: see db_claim_fair.h. */
#include "db_claim_fair.h"

#include "db_claim_sql.h"
#include "tables.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIR_TYPES_MAX 256u /* rotation cursors kept (types claimed lately) */
/* Rows a part reads in a keyed type: enough to see a key for each row wanted (the rows
 * wanted x the rows per key the last read found x 2), within [FAIR_READ_MIN,
 * FAIR_READ_MAX], so that a claim gives about one row to each key it sees and never
 * reads without bound. Keys with more rows than that allows share a claim's rows in
 * rounds: want / (FAIR_READ_MAX / rows per key) rows each at most. Before the first
 * read, FAIR_READ_FACTOR x the rows wanted. */
#define FAIR_READ_FACTOR 32u
#define FAIR_READ_MIN 256u
#define FAIR_READ_MAX 2048u
/* Rows the wide parts of one claim read in all: a claim of many keyed types reads
 * fewer rows of each, so that its memory stays bounded whatever the number of types. */
#define FAIR_READ_TOTAL 65536u
/* B's rows while A is expected to be cut (see dsp_fair_sql). */
#define FAIR_B_TOKEN 64u
/* Fair claims of a keyed type that read rows and saw no key before it goes back to the
 * plain read (a table that stopped using keys pays what a keyless one pays). */
#define FAIR_KEYLESS_CLAIMS 64u

/* A type's place in the rotation: the key it took from last, at priority prio. */
struct fair_type {
    char *type;     /* NULL: a free slot */
    bool valid;     /* a claim took a row since the slot was filled */
    uint8_t prio;
    bool key_null;
    uint16_t key_len;
    uint8_t key[DSP_FAIR_KEY_MAX];
    bool keyed;     /* a claim saw a row with a key: claims of it take the fair read */
    uint8_t keyless; /* fair claims since then that read rows and saw no key */
    bool a_cut;     /* the last claim's A was cut by its limit: B is likely not needed */
    uint32_t rows_per_key; /* ready rows per key in the last read (0: not known) */
    uint64_t used;  /* the claim that last used it (least recently used goes first) */
};

/* One row of a claim's read; its key's bytes are in dsp_fair.keys at key_off. */
struct fair_row {
    uint64_t id;
    uint32_t part;
    uint8_t prio;
    uint8_t tag; /* 0 A, 1 B, 2 B's keyless rows (read through claim_idx) */
    bool key_null;
    uint16_t key_len;
    size_t key_off;
};

#define ROW_KEY(f, r) ((f)->keys + (r)->key_off)

/* What dsp_fair_sql planned for a type of the claim. */
struct fair_part {
    struct fair_type *ft;
    bool with_a;
    unsigned a_limit, b_limit;
};

struct dsp_fair {
    struct fair_type types[FAIR_TYPES_MAX];
    uint64_t claims;
    size_t nkeyed;          /* slots with keyed set: 0 lets dsp_fair_use answer at once */
    uint64_t submits_seen;  /* the keyed-submit count the last dsp_fair_use saw */
    /* Until a claim reads rows, claims take the fair read whatever the types: a keyed
     * backlog found at start-up (a restart, a new leader) takes turns from the first
     * batch on. Only that first claim with rows: the fair read of a large keyless
     * backlog costs more than the plain one. */
    bool startup;
    struct fair_part *parts;
    size_t nparts, parts_cap;
    struct fair_row *rows;
    size_t nrows, rows_cap;
    uint8_t *keys; /* the rows' keys, one after the other */
    size_t nkeys, keys_cap;
    size_t *scratch; /* indices into rows: one part's S */
    size_t scratch_cap;
    size_t *groups;  /* starts of the key runs in scratch */
    size_t groups_cap;
};

dsp_fair *dsp_fair_new(void)
{
    dsp_fair *f = calloc(1, sizeof(dsp_fair));
    if (f != NULL)
        f->startup = true;
    return f;
}

void dsp_fair_free(dsp_fair *f)
{
    if (f == NULL)
        return;
    for (size_t i = 0; i < FAIR_TYPES_MAX; i++)
        free(f->types[i].type);
    free(f->parts);
    free(f->rows);
    free(f->keys);
    free(f->scratch);
    free(f->groups);
    free(f);
}

/* The slot of type t: found, else a free one, else the least recently used one. */
static struct fair_type *type_slot(dsp_fair *f, const char *t)
{
    struct fair_type *pick = NULL;

    for (size_t i = 0; i < FAIR_TYPES_MAX; i++) {
        struct fair_type *s = &f->types[i];
        if (s->type != NULL && strcmp(s->type, t) == 0) {
            s->used = f->claims;
            return s;
        }
        if (pick == NULL || (pick->type != NULL && (s->type == NULL || s->used < pick->used)))
            pick = s;
    }
    char *copy = strdup(t);
    if (copy == NULL)
        return NULL;
    if (pick->keyed)
        f->nkeyed--;
    free(pick->type);
    memset(pick, 0, sizeof *pick);
    pick->type = copy;
    pick->used = f->claims;
    return pick;
}

static void set_keyed(dsp_fair *f, struct fair_type *ft)
{
    if (!ft->keyed)
        f->nkeyed++;
    ft->keyed = true;
    ft->keyless = 0;
}

bool dsp_fair_use(dsp_fair *f, const char *const *types, size_t ntypes, uint64_t keyed_submits)
{
    if (keyed_submits != f->submits_seen) {
        f->submits_seen = keyed_submits;
        return true;
    }
    if (f->startup)
        return true;
    if (f->nkeyed == 0)
        return false;
    for (size_t i = 0; i < ntypes; i++) {
        if (types[i] == NULL)
            continue;
        for (size_t j = 0; j < FAIR_TYPES_MAX; j++) {
            const struct fair_type *s = &f->types[j];
            if (s->keyed && strcmp(s->type, types[i]) == 0)
                return true;
        }
    }
    return false;
}

void dsp_fair_saw_key(dsp_fair *f, const char *type)
{
    struct fair_type *ft;

    if (type != NULL && strlen(type) <= DSP_CLAIM_SQL_TYPE_MAX_BYTES &&
        (ft = type_slot(f, type)) != NULL)
        set_keyed(f, ft);
}

/* ---- the statement ---- */

struct fbuf {
    char *buf;
    size_t cap, len;
    bool bad;
};

static void fb_printf(struct fbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fb_printf(struct fbuf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->bad)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len) {
        b->bad = true;
        return;
    }
    b->len += (size_t)n;
}

/* X'hex' of bytes (a binary literal: group_key is VARBINARY). */
static void fb_hex(struct fbuf *b, const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789ABCDEF";

    if (b->bad || b->cap - b->len <= 2 * n + 3) {
        b->bad = true;
        return;
    }
    b->buf[b->len++] = 'X';
    b->buf[b->len++] = '\'';
    for (size_t i = 0; i < n; i++) {
        b->buf[b->len++] = digits[p[i] >> 4];
        b->buf[b->len++] = digits[p[i] & 15];
    }
    b->buf[b->len++] = '\'';
    b->buf[b->len] = '\0';
}

static void fb_type(struct fbuf *b, const char *type)
{
    int q;

    if (b->bad)
        return;
    q = dsp_claim_sql_quote_hex(NULL, b->buf + b->len, b->cap - b->len - 1, type, strlen(type));
    if (q < 0) {
        b->bad = true;
        return;
    }
    b->len += (size_t)q;
    b->buf[b->len] = '\0';
}

size_t dsp_fair_sql_bound(const char *const *types, size_t ntypes)
{
    /* Three reads per type: fixed text, the type's literal thrice, one key literal. */
    static const size_t part_fixed = 3 * 500 + DSP_TABLE_NAME_MAX * 3 + 2 * DSP_FAIR_KEY_MAX + 8;
    size_t total = 1;

    for (size_t i = 0; i < ntypes; i++) {
        size_t len = types[i] ? strlen(types[i]) : 0;
        total += part_fixed + 3 * DSP_CLAIM_SQL_LITERAL_MAX(len);
    }
    return total;
}

static unsigned read_limit(unsigned want, uint32_t rows_per_key)
{
    uint64_t m = (uint64_t)want * (rows_per_key ? 2u * (uint64_t)rows_per_key : FAIR_READ_FACTOR);
    if (m < FAIR_READ_MIN)
        m = FAIR_READ_MIN;
    if (m > FAIR_READ_MAX)
        m = FAIR_READ_MAX;
    return (unsigned)m;
}

int dsp_fair_sql(dsp_fair *f, char *buf, size_t cap, const char *const *types, size_t ntypes,
                 int64_t now_ms, unsigned want, const struct dsp_table_names *t)
{
    struct fbuf b = {buf, cap, 0, false};
    const char *task = t ? t->task : DSP_TABLE_NAME_DEFAULT;

    if (f == NULL || buf == NULL || cap == 0)
        return -1;
    buf[0] = '\0';
    f->nrows = 0;
    f->nkeys = 0;
    f->nparts = 0;
    f->claims++;
    if (ntypes == 0 || types == NULL || want == 0 || now_ms < 0)
        return -1;
    if (ntypes > f->parts_cap) {
        struct fair_part *np = realloc(f->parts, ntypes * sizeof *np);
        if (np == NULL)
            return -1;
        f->parts = np;
        f->parts_cap = ntypes;
    }
    for (size_t i = 0; i < ntypes && !b.bad; i++) {
        struct fair_part *p = &f->parts[i];
        struct fair_type *ft;

        if (types[i] == NULL || strlen(types[i]) > DSP_CLAIM_SQL_TYPE_MAX_BYTES ||
            (ft = type_slot(f, types[i])) == NULL)
            return -1;
        unsigned wide = read_limit(want, ft->rows_per_key);
        size_t share = FAIR_READ_TOTAL / ntypes;
        if (wide > share)
            wide = share > want ? (unsigned)share : want;
        p->ft = ft;
        p->with_a = ft->valid;
        p->a_limit = wide;
        /* B starts the rotation over (or starts it): as wide as A, so that a claim at
         * the end of the keys still sees enough keys to give one row to each. Without
         * keys, B is the plain claim's read (A then is an empty range). */
        p->b_limit = !ft->valid || (ft->keyed && !ft->a_cut) ? wide : want;
        /* A keyed type whose A was cut last time will most likely not wrap: B is then a
         * token read (its rows are not used unless A reaches the last key). */
        if (ft->valid && ft->keyed && ft->a_cut && p->b_limit > FAIR_B_TOKEN)
            p->b_limit = FAIR_B_TOKEN;
        f->nparts++;
        if (i > 0)
            fb_printf(&b, " UNION ALL ");
        if (p->with_a) {
            /* A: the keys after the cursor's, at the cursor's priority. */
            fb_printf(&b,
                      "(SELECT task_id, task_type, task_priority, group_key, 0 FROM %s"
                      " FORCE INDEX (group_idx) WHERE group_lane = 0 AND `delayed` = 0"
                      " AND task_type = ",
                      task);
            fb_type(&b, types[i]);
            fb_printf(&b, " AND task_priority = %u AND group_key ", (unsigned)ft->prio);
            if (ft->key_null)
                fb_printf(&b, "IS NOT NULL");
            else {
                fb_printf(&b, "> ");
                fb_hex(&b, ft->key, ft->key_len);
            }
            fb_printf(&b,
                      " AND run_after <= %" PRId64 " ORDER BY group_key, task_id LIMIT %u)"
                      " UNION ALL ",
                      now_ms, p->a_limit);
        }
        /* B's keyless rows, first (NULL is the first key): group_idx holds none (group_lane
         * is NULL for them, so that their claims do not move it); claim_idx holds exactly
         * them in lane 0 (a keyed row's claim_lane is NULL unless FAILED, version 12), in
         * priority and id order, with every column this read needs. */
        fb_printf(&b,
                  "(SELECT task_id, task_type, task_priority, NULL, 2 FROM %s"
                  " FORCE INDEX (claim_idx) WHERE claim_lane = 0 AND `delayed` = 0"
                  " AND task_type = ",
                  task);
        fb_type(&b, types[i]);
        fb_printf(&b,
                  " AND run_after <= %" PRId64
                  " ORDER BY task_priority DESC, task_id LIMIT %u) UNION ALL ",
                  now_ms, want);
        /* B: from the first key of the highest priority. */
        fb_printf(&b,
                  "(SELECT task_id, task_type, task_priority, group_key, 1 FROM %s"
                  " FORCE INDEX (group_idx) WHERE group_lane = 0 AND `delayed` = 0"
                  " AND task_type = ",
                  task);
        fb_type(&b, types[i]);
        fb_printf(&b,
                  " AND run_after <= %" PRId64
                  " ORDER BY task_priority DESC, group_key, task_id LIMIT %u)",
                  now_ms, p->b_limit);
    }
    if (b.bad || b.len > INT_MAX) {
        buf[0] = '\0';
        return -1;
    }
    return (int)b.len;
}

int dsp_fair_add(dsp_fair *f, size_t part, uint64_t id, uint8_t prio, const void *key,
                 size_t key_len, bool key_null, unsigned tag)
{
    struct fair_row *r;

    if (part >= f->nparts || key_len > DSP_FAIR_KEY_MAX || tag > 2 || (!key_null && !key && key_len))
        return -1;
    if (f->nrows == f->rows_cap) {
        size_t want = f->rows_cap ? 2 * f->rows_cap : 256;
        struct fair_row *nr = realloc(f->rows, want * sizeof *nr);
        if (nr == NULL)
            return -1;
        f->rows = nr;
        f->rows_cap = want;
    }
    if (!key_null && f->keys_cap - f->nkeys < key_len) {
        size_t want = f->keys_cap ? 2 * f->keys_cap : 4096;
        while (want - f->nkeys < key_len)
            want *= 2;
        uint8_t *nk = realloc(f->keys, want);
        if (nk == NULL)
            return -1;
        f->keys = nk;
        f->keys_cap = want;
    }
    r = &f->rows[f->nrows++];
    r->id = id;
    r->part = (uint32_t)part;
    r->prio = prio;
    r->tag = (uint8_t)tag;
    r->key_null = key_null;
    r->key_len = key_null ? 0 : (uint16_t)key_len;
    r->key_off = f->nkeys;
    if (r->key_len) {
        memcpy(f->keys + f->nkeys, key, r->key_len);
        f->nkeys += r->key_len;
    }
    return 0;
}

/* Digits only, at most max: the claim's columns as the server sends them. strtoul costs
 * several times more, once per row of a read of up to 2,048. */
static bool parse_uint(const char *s, unsigned long len, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;

    if (s == NULL || len == 0 || len > 20)
        return false;
    for (unsigned long i = 0; i < len; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (d > 9 || v > (max - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

int dsp_fair_add_text(dsp_fair *f, size_t part, const char *id, unsigned long id_len,
                      const char *prio, unsigned long prio_len, const char *key,
                      unsigned long key_len, const char *tag, unsigned long tag_len)
{
    uint64_t i, p, t;

    if (!parse_uint(id, id_len, UINT64_MAX, &i) || !parse_uint(prio, prio_len, UINT8_MAX, &p) ||
        !parse_uint(tag, tag_len, 2, &t))
        return -1;
    return dsp_fair_add(f, part, i, (uint8_t)p, key, key == NULL ? 0 : key_len, key == NULL,
                        (unsigned)t);
}

size_t dsp_fair_nrows(const dsp_fair *f)
{
    return f->nrows;
}

void dsp_fair_trim(dsp_fair *f)
{
    /* Kept while small: most claims need about the same again. */
    if (f->parts_cap > 64) {
        free(f->parts);
        f->parts = NULL;
        f->parts_cap = 0;
        f->nparts = 0;
    }
    if (f->rows_cap > 8192) {
        free(f->rows);
        f->rows = NULL;
        f->rows_cap = f->nrows = 0;
        free(f->scratch);
        f->scratch = NULL;
        f->scratch_cap = 0;
        free(f->groups);
        f->groups = NULL;
        f->groups_cap = 0;
    }
    if (f->keys_cap > 65536) {
        free(f->keys);
        f->keys = NULL;
        f->keys_cap = f->nkeys = 0;
    }
}

/* Keys in the order of group_idx: NULL first, then bytewise, a prefix first. */
static int key_cmp(bool an, const uint8_t *a, size_t al, bool bn, const uint8_t *b, size_t bl)
{
    int c;

    if (an || bn)
        return an == bn ? 0 : an ? -1 : 1;
    /* An empty key may sit at a NULL arena (nothing stored yet): memcmp must not see it. */
    c = (al < bl ? al : bl) > 0 ? memcmp(a, b, al < bl ? al : bl) : 0;
    if (c != 0)
        return c;
    return al < bl ? -1 : al > bl;
}

static bool same_key(const dsp_fair *f, const struct fair_row *a, const struct fair_row *b)
{
    return a->key_len == b->key_len && a->key_null == b->key_null &&
           (a->key_len == 0 || memcmp(ROW_KEY(f, a), ROW_KEY(f, b), a->key_len) == 0);
}

static bool grow(size_t **arr, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t *n = realloc(*arr, need * sizeof **arr);
    if (n == NULL)
        return false;
    *arr = n;
    *cap = need;
    return true;
}

/* Takes rows in turn between the key runs of scratch[0..ns): one row per key per round.
 * Returns the number taken (added at ids + taken), sets *last to the last one's row. */
static size_t take_rounds(dsp_fair *f, size_t ns, unsigned want, size_t taken, uint64_t *ids,
                          uint8_t *prios, const struct fair_row **last, size_t max_rounds)
{
    size_t ng = 0;

    if (ns == 0 || !grow(&f->groups, &f->groups_cap, ns + 1))
        return taken;
    for (size_t i = 0; i < ns; i++)
        if (i == 0 || !same_key(f, &f->rows[f->scratch[i - 1]], &f->rows[f->scratch[i]]))
            f->groups[ng++] = i;
    f->groups[ng] = ns;
    for (size_t round = 0; taken < want && round < max_rounds; round++) {
        bool any = false;
        for (size_t g = 0; g < ng && taken < want; g++) {
            if (f->groups[g] + round >= f->groups[g + 1])
                continue;
            const struct fair_row *r = &f->rows[f->scratch[f->groups[g] + round]];
            ids[taken] = r->id;
            prios[taken++] = r->prio;
            /* The cursor: the last turn given; the keys after it come first next time. */
            *last = r;
            any = true;
        }
        if (!any)
            break;
    }
    return taken;
}

size_t dsp_fair_pick(dsp_fair *f, size_t part, unsigned want, uint64_t *ids, uint8_t *prios,
                     bool *more)
{
    struct fair_part *p;
    struct fair_type *ft;
    const struct fair_row *last = NULL;
    size_t na = 0, nb = 0, nc = 0, ns = 0, taken = 0, nrows_part = 0, twice = 0;
    uint8_t top = 0;
    bool have_top = false, keyed = false;

    *more = false;
    if (part >= f->nparts || want == 0 || !grow(&f->scratch, &f->scratch_cap, f->nrows + 1))
        return 0;
    p = &f->parts[part];
    ft = p->ft;
    for (size_t i = 0; i < f->nrows; i++) {
        const struct fair_row *r = &f->rows[i];
        if (r->part != part)
            continue;
        nrows_part++;
        keyed |= !r->key_null;
        if (r->tag == 0)
            na++;
        else {
            if (r->tag == 1)
                nb++;
            else
                nc++;
            if (!have_top || r->prio > top) {
                top = r->prio;
                have_top = true;
            }
        }
    }
    /* A part cut by its limit, or a window of keyless rows as long as its limit: more
     * may follow. (A shorter window held every ready row it could.) */
    if (na >= p->a_limit || nb >= p->b_limit || nc >= want)
        *more = true;
    /* Rows per key of what was read: each part comes key by key. */
    {
        size_t keys = 0;
        const struct fair_row *prev = NULL;
        for (size_t i = 0; i < f->nrows; i++) {
            const struct fair_row *r = &f->rows[i];
            if (r->part != part)
                continue;
            if (prev == NULL || prev->tag != r->tag || prev->prio != r->prio || !same_key(f, prev, r))
                keys++;
            prev = r;
        }
        if (keys > 0)
            ft->rows_per_key = (uint32_t)((na + nb + nc + keys - 1) / keys);
    }
    if (nrows_part > 0)
        f->startup = false;
    if (keyed)
        set_keyed(f, ft);
    else if (ft->keyed && nrows_part > 0 && ++ft->keyless >= FAIR_KEYLESS_CLAIMS) {
        ft->keyed = false;
        f->nkeyed--;
    }
    if (!have_top)
        return 0;

    /* S at the highest priority: the keys after the cursor (A), then from the first key
     * up to the cursor's (B), when the cursor is at that priority; else B alone. */
    bool from_cursor = p->with_a && ft->valid && ft->prio == top;
    /* A cut by its limit: keys follow that this claim did not see, so the keys from the
     * start wait for the next round of the rotation. */
    bool wrap = !(from_cursor && na >= p->a_limit);
    if (from_cursor)
        ft->a_cut = na >= p->a_limit;
    /* B read narrow (A was cut last time) and cut, while A reached the last key: S holds
     * few of the keys; one round only, and the next claim's A reads on from there. */
    size_t max_rounds = from_cursor && wrap && ft->keyed && p->b_limit < p->a_limit &&
                                nb >= p->b_limit
                            ? 1
                            : SIZE_MAX;
    if (from_cursor)
        for (size_t i = 0; i < f->nrows; i++) {
            const struct fair_row *r = &f->rows[i];
            if (r->part == part && r->tag == 0 && r->prio == top)
                f->scratch[ns++] = i;
        }
    for (size_t i = 0; i < f->nrows; i++) {
        const struct fair_row *r = &f->rows[i];
        if (r->part != part || r->tag == 0 || r->prio != top || !wrap)
            continue;
        if (from_cursor &&
            key_cmp(r->key_null, ROW_KEY(f, r), r->key_len, ft->key_null, ft->key, ft->key_len) > 0) {
            twice++; /* after the cursor: A has it (A was not cut, so it read every one) */
            continue;
        }
        f->scratch[ns++] = i;
    }
    taken = take_rounds(f, ns, want, 0, ids, prios, &last, max_rounds);

    /* Lower priorities, only when B holds them: then every row of the highest is read. */
    for (int prio = (int)top - 1; prio >= 0 && taken < want; prio--) {
        ns = 0;
        for (size_t i = 0; i < f->nrows; i++) {
            const struct fair_row *r = &f->rows[i];
            if (r->part == part && r->tag != 0 && r->prio == (uint8_t)prio)
                f->scratch[ns++] = i;
        }
        taken = take_rounds(f, ns, want, taken, ids, prios, &last, max_rounds);
    }
    /* Rows read and not taken (a row B read twice counts once): the claim was cut short
     * by the rotation, and the caller claims again at once (db_claim.c: the reply's
     * `more`, without which the loop waits --poll-ms as after a drained table). */
    if (taken + twice < nrows_part)
        *more = true;
    if (last != NULL) {
        ft->valid = true;
        ft->prio = last->prio;
        ft->key_null = last->key_null;
        ft->key_len = last->key_len;
        if (last->key_len > 0) /* an empty key's arena may be NULL */
            memcpy(ft->key, ROW_KEY(f, last), last->key_len);
    }
    return taken;
}
