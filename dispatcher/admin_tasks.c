/* admin_tasks.c: the task-level requests of the admin port (docs/admin.md): GET /task
 * (one task: its row, and where this dispatcher holds it), GET /failed (the latest
 * failures), POST /retry (FAILED back to NEW), POST /retry-failed (those of a type that
 * failed since a time, a bounded batch) and POST /cancel. The rows are read
 * and changed by the stats thread (dsp_db_taskop); the HTTP request is answered when
 * its answer comes back to the loop (dsp_admin_taskop_answer). A task this dispatcher
 * holds is cancelled here, in memory, and its row written by the fenced write path. */
#include "admin_http.h"

#include "conn.h"
#include "utf8.h"
#include "server.h"

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIMIT_DEFAULT 20u
/* The end of year 9999 in ms: a later "since" is a mistake, not a time. */
#define RETRY_SINCE_MAX 253402300799999ull

static const char *const state_names[4] = {"NEW", "PROCESSING", "SUCCESSFUL", "FAILED"};

static const char *state_name(int state)
{
    return state >= 0 && state < 4 ? state_names[state] : "unknown";
}

/* ---- the query string ---- */

/* Parses the query string into params (empty when none); -1 after a 400. */
static int query_parse(struct evhttp_request *req, struct evkeyvalq *params)
{
    memset(params, 0, sizeof *params); /* TAILQ_INIT */
    params->tqh_last = &params->tqh_first;
    const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    if (q && *q && evhttp_parse_query_str(q, params) != 0) {
        dsp_admin_send_error(req, HTTP_BADREQUEST, "bad query string");
        return -1;
    }
    return 0;
}

/* Decimal digits only, at most max; no sign, no blanks. -1 when not. */
static int parse_decimal(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!s || !*s || strlen(s) > 20)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* ?id=N, 1 .. 2^64-1 (task_id is a BIGINT UNSIGNED). -1 after a 400. */
static int param_id(struct evhttp_request *req, struct evkeyvalq *params, uint64_t *id)
{
    if (parse_decimal(evhttp_find_header(params, "id"), UINT64_MAX, id) < 0 || *id == 0) {
        dsp_admin_send_error(req, HTTP_BADREQUEST, "id must be a task id: 1 to 18446744073709551615");
        return -1;
    }
    return 0;
}

/* The request's task id from its query string, or -1 after a 400. */
static int request_id(struct evhttp_request *req, uint64_t *id)
{
    struct evkeyvalq params;
    if (query_parse(req, &params) < 0)
        return -1;
    int rc = param_id(req, &params, id);
    evhttp_clear_headers(&params);
    return rc;
}

/* ---- requests to the database side ---- */

static dsp_taskop *taskop_new(struct evhttp_request *req, int kind, uint64_t id)
{
    dsp_taskop *op = calloc(1, sizeof *op);
    if (!op) {
        dsp_admin_send_error(req, HTTP_INTERNAL, "out of memory");
        return NULL;
    }
    op->kind = kind;
    op->task_id = id;
    op->ctx = req;
    return op;
}

static void taskop_submit(dsp_server *srv, struct evhttp_request *req, dsp_taskop *op)
{
    if (dsp_db_taskop(srv->db, op) < 0) {
        dsp_taskop_free(op);
        dsp_admin_send_error(req, 503, "the database side is not available");
    }
}

void dsp_admin_task_cb(struct evhttp_request *req, void *arg)
{
    uint64_t id;
    dsp_taskop *op;
    if (!dsp_admin_only_get(req) || request_id(req, &id) < 0 || !(op = taskop_new(req, DSP_TASKOP_SHOW, id)))
        return;
    taskop_submit(arg, req, op);
}

/* Why a task type given in a query is refused, or NULL when it is a good one. */
static const char *type_refused(const char *type)
{
    if (!*type || strlen(type) > 256)
        return "type must be 1 to 256 bytes";
    if (dsp_utf8_valid_prefix((const uint8_t *)type, strlen(type)) != strlen(type))
        return "a task type must be UTF-8";
    return NULL;
}

/* A new operation of kind with a copy of type (NULL: none), or NULL with the request
 * answered. */
static dsp_taskop *taskop_typed(struct evhttp_request *req, int kind, const char *type)
{
    dsp_taskop *op = taskop_new(req, kind, 0);
    if (op && type && !(op->type = strdup(type))) {
        dsp_taskop_free(op);
        op = NULL;
        dsp_admin_send_error(req, HTTP_INTERNAL, "out of memory");
    }
    return op;
}

void dsp_admin_failed_cb(struct evhttp_request *req, void *arg)
{
    struct evkeyvalq params;
    if (!dsp_admin_only_get(req) || query_parse(req, &params) < 0)
        return;
    const char *type = evhttp_find_header(&params, "type");
    const char *lim = evhttp_find_header(&params, "limit");
    uint64_t limit = LIMIT_DEFAULT;
    const char *bad = NULL;
    if (lim && (parse_decimal(lim, DSP_TASKOP_LIMIT_MAX, &limit) < 0 || limit == 0))
        bad = "limit must be 1 to 1000";
    else if (type)
        bad = type_refused(type);
    dsp_taskop *op = NULL;
    if (bad)
        dsp_admin_send_error(req, HTTP_BADREQUEST, bad);
    else if ((op = taskop_typed(req, DSP_TASKOP_FAILED, type)) != NULL)
        op->limit = (unsigned)limit;
    evhttp_clear_headers(&params);
    if (op)
        taskop_submit(arg, req, op);
}

void dsp_admin_retry_cb(struct evhttp_request *req, void *arg)
{
    uint64_t id;
    dsp_taskop *op;
    if (!dsp_admin_post_allowed(req, arg) || request_id(req, &id) < 0 ||
        !(op = taskop_new(req, DSP_TASKOP_RETRY, id)))
        return;
    taskop_submit(arg, req, op);
}

/* POST /retry-failed?type=T&since=MS[&limit=N]: the FAILED rows of T that failed at or
 * after MS back to NEW, at most N (default and most DSP_TASKOP_LIMIT_MAX) per request;
 * "more" in the answer says to ask again. */
void dsp_admin_retry_failed_cb(struct evhttp_request *req, void *arg)
{
    struct evkeyvalq params;
    if (!dsp_admin_post_allowed(req, arg) || query_parse(req, &params) < 0)
        return;
    const char *type = evhttp_find_header(&params, "type");
    const char *since = evhttp_find_header(&params, "since");
    const char *lim = evhttp_find_header(&params, "limit");
    uint64_t limit = DSP_TASKOP_LIMIT_MAX, since_ms = 0;
    const char *bad = type ? type_refused(type) : "type must be 1 to 256 bytes";
    if (!bad && parse_decimal(since, RETRY_SINCE_MAX, &since_ms) < 0)
        bad = "since must be a time in ms since 1970, 0 to 253402300799999";
    if (!bad && lim && (parse_decimal(lim, DSP_TASKOP_LIMIT_MAX, &limit) < 0 || limit == 0))
        bad = "limit must be 1 to 1000";
    dsp_taskop *op = NULL;
    if (bad)
        dsp_admin_send_error(req, HTTP_BADREQUEST, bad);
    else if ((op = taskop_typed(req, DSP_TASKOP_RETRY_FAILED, type)) != NULL) {
        op->limit = (unsigned)limit;
        op->since_ms = (int64_t)since_ms;
    }
    evhttp_clear_headers(&params);
    if (op)
        taskop_submit(arg, req, op);
}

static void answer_cancelled(struct evhttp_request *req, uint64_t id, const char *was, const char *worker)
{
    json_t *o = json_pack("{s:b, s:I, s:s, s:s}", "ok", 1, "task_id", (json_int_t)id, "state", "FAILED",
                          "cancelled", was);
    if (o && worker)
        json_object_set_new(o, "worker", json_string(worker));
    dsp_admin_send_json(req, HTTP_OK, o);
}

/* A task this dispatcher holds is cancelled in memory: answers and returns true. */
static bool cancel_held(dsp_server *srv, struct evhttp_request *req, uint64_t id)
{
    dsp_task *t = dsp_taskmap_get(&srv->tasks.map, id);
    if (!t)
        return false;
    char worker[256] = "";
    if (t->holder)
        snprintf(worker, sizeof worker, "%s", t->holder->name ? t->holder->name : "");
    char *clean = worker[0] ? dsp_utf8_copy(worker) : NULL;
    const char *was = dsp_server_cancel_held(srv, t);
    answer_cancelled(req, id, was, clean);
    free(clean);
    return true;
}

void dsp_admin_cancel_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    uint64_t id;
    dsp_taskop *op;
    if (!dsp_admin_post_allowed(req, srv) || request_id(req, &id) < 0 || cancel_held(srv, req, id) ||
        !(op = taskop_new(req, DSP_TASKOP_CANCEL, id)))
        return;
    taskop_submit(srv, req, op);
}

/* ---- answers ---- */

json_t *dsp_admin_progress_json(const dsp_task *t)
{
    const dsp_progress *p = t->progress;
    if (!p || !t->holder || p->attempt != t->attempts)
        return json_null();
    /* msg was checked as UTF-8 without NUL by the decoder. */
    return json_pack("{s:I, s:s%, s:I}", "permille", (json_int_t)p->permille, "message", p->msg,
                     (size_t)p->msg_len, "at_ms", (json_int_t)p->at_ms);
}

/* Where this dispatcher holds task id now: null (not held), buffered, or running on a
 * worker since a wall-clock time, with the progress its worker reported last. */
static json_t *held_json(dsp_server *srv, uint64_t id)
{
    dsp_task *t = dsp_taskmap_get(&srv->tasks.map, id);
    if (!t)
        return json_null();
    if (!t->holder)
        return json_pack("{s:s}", "state", "buffered");
    char *name = dsp_utf8_copy(t->holder->name ? t->holder->name : "");
    int64_t since = dsp_wall_ms() - (dsp_now_us() - t->delivered_us) / 1000;
    json_t *o = json_pack("{s:s, s:s?, s:s, s:I, s:I, s:o}", "state", "running", "worker", name, "addr",
                          t->holder->addr, "since_ms", (json_int_t)since, "attempt", (json_int_t)t->attempts,
                          "progress", dsp_admin_progress_json(t));
    free(name);
    return o;
}

static void answer_conflict(struct evhttp_request *req, const dsp_taskop *op, const char *want)
{
    char text[200];
    snprintf(text, sizeof text, "task %llu is %s, not %s", (unsigned long long)op->task_id,
             state_name(op->state), want);
    dsp_admin_send_error(req, 409, text);
}

void dsp_admin_taskop_answer(void *arg, dsp_taskop *op)
{
    dsp_server *srv = arg;
    struct evhttp_request *req = op->ctx;
    char text[200];

    if (op->status == DSP_TASKOP_ERROR) {
        dsp_admin_send_error(req, 503, "the database did not answer; try again");
    } else if (op->status == DSP_TASKOP_NOT_FOUND) {
        snprintf(text, sizeof text, "no task %llu", (unsigned long long)op->task_id);
        dsp_admin_send_error(req, HTTP_NOTFOUND, text);
    } else if (op->kind == DSP_TASKOP_SHOW) {
        /* The report in this dispatcher's memory, else the one the table holds (stored by
         * an earlier leader, or this one's of a second ago). */
        json_t *held = held_json(srv, op->task_id);
        json_t *mem = json_object_get(held, "progress"), *stored = json_object_get(op->answer, "progress_stored");
        json_t *p = json_is_object(mem) ? json_deep_copy(mem) : json_is_object(stored) ? json_deep_copy(stored) : NULL;
        if (p)
            json_object_set_new(p, "from", json_string(json_is_object(mem) ? "dispatcher" : "table"));
        json_object_set_new(op->answer, "progress", p ? p : json_null());
        json_object_del(op->answer, "progress_stored");
        json_object_set_new(op->answer, "dispatcher", held);
        dsp_admin_send_json(req, HTTP_OK, json_incref(op->answer));
    } else if (op->kind == DSP_TASKOP_FAILED) {
        dsp_admin_send_json(req, HTTP_OK, json_incref(op->answer));
    } else if (op->kind == DSP_TASKOP_RETRY_FAILED) {
        if (op->rows) {
            dsp_claim_pacing_hasten(srv); /* rows are ready: claim without waiting for the poll */
            dsp_server_kick(srv);
        }
        dsp_admin_send_json(req, HTTP_OK,
                            json_pack("{s:b, s:s, s:I, s:I, s:b}", "ok", 1, "type", op->type,
                                      "since_ms", (json_int_t)op->since_ms, "rows", (json_int_t)op->rows,
                                      "more", op->rows >= op->limit));
    } else if (op->kind == DSP_TASKOP_RETRY) {
        if (op->status == DSP_TASKOP_CONFLICT) {
            answer_conflict(req, op, "FAILED");
        } else {
            dsp_claim_pacing_hasten(srv); /* a row is ready: claim without waiting for the poll */
            dsp_server_kick(srv);
            dsp_admin_send_json(req, HTTP_OK,
                                json_pack("{s:b, s:I, s:s}", "ok", 1, "task_id", (json_int_t)op->task_id,
                                          "state", "NEW"));
        }
    } else if (op->status == DSP_TASKOP_OK) {
        answer_cancelled(req, op->task_id, op->kind == DSP_TASKOP_CANCEL ? "new" : "unheld", NULL);
    } else if (op->state == 1 && cancel_held(srv, req, op->task_id)) {
        /* Claimed by this dispatcher while the UPDATE ran: cancelled in memory. */
    } else if (op->state == 1 && op->kind == DSP_TASKOP_CANCEL && srv->lead.leading && srv->lead.epoch != 0) {
        /* PROCESSING and not held here: ended at once if no dispatcher can hold it (an
         * orphan, db_sql.h); a row of this epoch (a claim on its way to the loop, an
         * outcome being written) or of a newer one is left alone, and answers 409. */
        op->kind = DSP_TASKOP_CANCEL_ORPHAN;
        op->epoch = srv->lead.epoch;
        op->status = DSP_TASKOP_ERROR;
        taskop_submit(srv, req, op);
        return;
    } else if (op->state == 1) {
        snprintf(text, sizeof text,
                 "task %llu is PROCESSING but not held by this dispatcher (claimed by another, or "
                 "its outcome is being written); try again",
                 (unsigned long long)op->task_id);
        dsp_admin_send_error(req, 409, text);
    } else {
        answer_conflict(req, op, "NEW or PROCESSING");
    }
    dsp_taskop_free(op);
}

bool dsp_admin_type_known(dsp_server *srv, const char *type)
{
    if (dsp_server_type_find(srv, (const uint8_t *)type, strlen(type)) || dsp_server_type_ever_registered(srv, type))
        return true;
    dsp_table_stats *ts = malloc(sizeof *ts);
    bool known = false;
    if (!ts)
        return true; /* cannot tell: do not refuse */
    dsp_db_table_stats_get(srv->db, ts);
    for (size_t i = 0; ts->valid && i < ts->ntypes && !known; i++)
        known = strcmp(ts->types[i].type, type) == 0;
    free(ts);
    return known;
}
