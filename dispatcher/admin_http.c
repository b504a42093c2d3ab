/* admin_http.c: the admin port on evhttp, on the dispatcher's own loop: routes, the
 * Host check, the protections of the POSTs. Every handler here answers from memory;
 * the task-level requests, which ask the database side, are in admin_tasks.c. */
#include "admin_http.h"

#include "conn.h"
#include "dashboard.h"
#include "history.h"
#include "utf8.h"
#include "server.h"
#include "stats.h"
#include "tls.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static void send_json_status(struct evhttp_request *req, int code, const char *reason, json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        evhttp_send_error(req, HTTP_INTERNAL, "cannot encode the answer");
        return;
    }
    struct evbuffer *out = evbuffer_new();
    evbuffer_add(out, text, strlen(text));
    evbuffer_add(out, "\n", 1);
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, code, reason, out);
    evbuffer_free(out);
}

/* An error answer that keeps the headers set before it (evhttp_send_error
 * clears them, and a 405 needs its Allow, a 401 its WWW-Authenticate). */
static void send_error_text(struct evhttp_request *req, int code, const char *reason)
{
    struct evbuffer *out = evbuffer_new();
    if (!out) {
        evhttp_send_error(req, code, reason);
        return;
    }
    evbuffer_add_printf(out, "%d %s\n", code, reason);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain");
    evhttp_send_reply(req, code, reason, out);
    evbuffer_free(out);
}

static void send_json(struct evhttp_request *req, json_t *body)
{
    send_json_status(req, HTTP_OK, "OK", body);
}

static bool only_get(struct evhttp_request *req)
{
    if (evhttp_request_get_command(req) == EVHTTP_REQ_GET)
        return true;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
    send_error_text(req, 405, "use GET");
    return false;
}

static void healthz_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!only_get(req))
        return;
    struct evbuffer *out = evbuffer_new();
    char why[DSP_DB_PROBLEM_MAX];
    bool ok = dsp_stats_health(srv, why, sizeof why);
    evbuffer_add_printf(out, "%s\n", ok ? "ok" : why);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain");
    evhttp_send_reply(req, ok ? HTTP_OK : 503, ok ? "OK" : "Service Unavailable", out);
    evbuffer_free(out);
}

static json_t *paused_json(const dsp_server *srv)
{
    json_t *types = json_array();
    for (const dsp_type *ty = srv->types.list; ty; ty = ty->next)
        if (ty->paused)
            json_array_append_new(types, json_string(ty->name));
    return json_pack("{s:b, s:o}", "all", srv->control.paused_all, "types", types);
}

static void stats_cb(struct evhttp_request *req, void *arg)
{
    if (!only_get(req))
        return;
    dsp_stats_snapshot snap;
    dsp_stats_snapshot_fill(&snap, arg);
    send_json(req, dsp_stats_json(&snap));
    dsp_stats_snapshot_clear(&snap);
}

static json_t *json_text(const char *s)
{
    char *clean = dsp_utf8_copy(s);
    json_t *j = clean ? json_string(clean) : NULL;
    free(clean);
    return j;
}

static json_t *workers_json(dsp_server *srv)
{
    json_t *list = json_array();
    int64_t now = dsp_now_ms();
    for (dsp_conn *c = srv->conns.list; c; c = c->next) {
        if (c->state != DSP_CONN_ACTIVE)
            continue;
        json_t *types = json_array();
        for (size_t i = 0; i < c->ntypes; i++)
            json_array_append_new(types, json_text(c->types[i]->name));
        json_array_append_new(
            list, json_pack("{s:o, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:b}", "name",
                            json_text(c->name ? c->name : ""), "addr",
                            c->addr, "types", types, "capacity", (json_int_t)c->slots.capacity,
                            "in_flight", (json_int_t)c->slots.in_flight, "completed_total",
                            (json_int_t)c->completed_total, "delivered_total",
                            (json_int_t)c->delivered_total, "connected_s",
                            (json_int_t)((now - c->connected_ms) / 1000), "accepting",
                            c->slots.accepting));
    }
    return list;
}

static void workers_cb(struct evhttp_request *req, void *arg)
{
    if (!only_get(req))
        return;
    send_json(req, workers_json(arg));
}

/* Where workers connect, as bound (--listen with port 0 names no port), or NULL. */
static json_t *listen_json(dsp_server *srv)
{
    char host[256], out[300];
    unsigned port;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (!srv->accept.listener || dsp_hostport_parse(srv->cfg->listen, host, sizeof host, &port) < 0 ||
        getsockname(evconnlistener_get_fd(srv->accept.listener), (struct sockaddr *)&ss, &sl) != 0)
        return NULL;
    port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    dsp_hostport_format(out, sizeof out, host, port);
    return json_text(out);
}

json_t *dsp_admin_first_json(dsp_server *srv)
{
    dsp_stats_snapshot snap;
    dsp_stats_snapshot_fill(&snap, srv);
    json_t *o = json_pack("{s:o?, s:o?, s:o?, s:o?}", "stats", dsp_stats_json(&snap), "workers", workers_json(srv),
                          "history", dsp_history_json(&srv->stats.history, dsp_wall_ms()), "listen",
                          listen_json(srv));
    dsp_stats_snapshot_clear(&snap);
    return o;
}

/* ---- GET /metrics: Prometheus text exposition format 0.0.4 (stats.c) ---- */

static void metrics_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!only_get(req))
        return;
    struct evbuffer *out = evbuffer_new();
    if (!out) {
        evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
        return;
    }
    dsp_stats_snapshot snap;
    dsp_stats_snapshot_fill(&snap, srv);
    dsp_stats_metrics(&snap, out);
    dsp_stats_snapshot_clear(&snap);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; version=0.0.4");
    evhttp_send_reply(req, HTTP_OK, "OK", out);
    evbuffer_free(out);
}

/* ---- state-changing requests: POST only, not "simple", with the bearer token when set ---- */

static bool token_ok(const char *have, const char *want)
{
    size_t hl = strlen(have), wl = strlen(want);
    unsigned char diff = hl != wl;
    for (size_t i = 0; i < wl; i++)
        diff |= (unsigned char)(have[i < hl ? i : 0] ^ want[i]);
    return diff == 0 && hl == wl;
}

/* A browser sends a cross-origin POST without asking first only when it is
 * "simple": no custom header, and a form or text/plain body. The header
 * X-Taskpush-Admin (any value) or a JSON body type needs a CORS preflight, which
 * this port never grants, so no web page can pause the dispatcher through an
 * operator's browser. */
static bool not_simple(struct evhttp_request *req)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    if (evhttp_find_header(in, "X-Taskpush-Admin"))
        return true;
    const char *ct = evhttp_find_header(in, "Content-Type");
    static const char json[] = "application/json";
    const size_t n = sizeof json - 1;
    if (!ct)
        return false;
    ct += strspn(ct, " \t");
    return strncasecmp(ct, json, n) == 0 &&
           (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ' || ct[n] == '\t');
}

static bool post_allowed(struct evhttp_request *req, dsp_server *srv)
{
    struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        evhttp_add_header(oh, "Allow", "POST");
        send_error_text(req, 405, "use POST");
        return false;
    }
    if (!not_simple(req)) {
        send_error_text(
            req, 403,
            "a POST needs the header X-Taskpush-Admin: 1 (or Content-Type: application/json)");
        return false;
    }
    /* The admin token when one is set, else the workers' token. */
    const char *want = srv->cfg->admin_token ? srv->cfg->admin_token : srv->cfg->token;
    if (want) {
        const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
        if (!auth || strncmp(auth, "Bearer ", 7) != 0 || !token_ok(auth + 7, want)) {
            evhttp_add_header(oh, "WWW-Authenticate", "Bearer");
            send_error_text(req, 401, "a bearer token is required");
            return false;
        }
    }
    return true;
}

/* The optional ?type=T. Returns 0 (type set or NULL), or -1 after a 400. */
static int query_type(struct evhttp_request *req, char *buf, size_t buflen, const char **type)
{
    *type = NULL;
    const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    if (!q || !*q)
        return 0;
    struct evkeyvalq params;
    memset(&params, 0, sizeof params); /* TAILQ_INIT: an empty list */
    params.tqh_last = &params.tqh_first;
    if (evhttp_parse_query_str(q, &params) != 0) {
        send_error_text(req, HTTP_BADREQUEST, "bad query string");
        return -1;
    }
    const char *t = evhttp_find_header(&params, "type");
    int rc = 0;
    if (t) {
        size_t n = strlen(t);
        if (n == 0 || n >= buflen || n > 256) {
            send_error_text(req, HTTP_BADREQUEST, "type must be 1 to 256 bytes");
            rc = -1;
        } else {
            memcpy(buf, t, n + 1);
            *type = buf;
        }
    }
    evhttp_clear_headers(&params);
    return rc;
}

static json_t *state_json(const dsp_server *srv)
{
    return json_pack("{s:b, s:o, s:b}", "ok", 1, "paused", paused_json(srv), "draining",
                     srv->control.draining || srv->control.admin_draining);
}

/* True when the query string has force=1 (or force=true). */
static bool query_force(struct evhttp_request *req)
{
    const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    struct evkeyvalq params;
    memset(&params, 0, sizeof params);
    params.tqh_last = &params.tqh_first;
    if (!q || evhttp_parse_query_str(q, &params) != 0)
        return false;
    const char *f = evhttp_find_header(&params, "force");
    bool force = f && (strcmp(f, "1") == 0 || strcmp(f, "true") == 0);
    evhttp_clear_headers(&params);
    return force;
}

/* A type no worker registered and the table does not know is likely a typo: 404
 * unless ?force=1. Returns false after answering. */
static bool type_allowed(struct evhttp_request *req, dsp_server *srv, const char *type)
{
    if (!type || query_force(req) || dsp_admin_type_known(srv, type))
        return true;
    if (dsp_utf8_valid_prefix((const uint8_t *)type, strlen(type)) != strlen(type)) {
        send_error_text(req, HTTP_BADREQUEST, "a task type must be UTF-8");
        return false;
    }
    send_error_text(req, HTTP_NOTFOUND,
                    "no worker registered this type and the table has no rows of it; add force=1 to name it anyway");
    return false;
}

/* Keeps an operator's setting in the settings table, for the next leader (and this
 * dispatcher's next start): docs/taskpushd.md "Runtime settings". */
static void keep_setting(dsp_server *srv, const char *type, enum dsp_setting_what what, bool paused,
                         const dsp_type_limit *l)
{
    dsp_setting s = {.type = (char *)(type ? type : ""), .paused = paused};
    if (l) {
        s.has_limit = true;
        s.concurrency = l->concurrency;
        s.rate = l->rate;
        s.per_group = l->per_group;
    }
    if (srv->db && dsp_db_setting_save(srv->db, &s, what) < 0)
        log_warn(&srv->log, "the setting of type %s is not kept in the table (out of memory)",
                 type ? type : "(every type)");
}

static void pause_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    char buf[300];
    const char *type;
    if (!post_allowed(req, srv) || query_type(req, buf, sizeof buf, &type) < 0 ||
        !type_allowed(req, srv, type))
        return;
    const char *why = dsp_server_pause(srv, type);
    if (why) {
        send_error_text(req, HTTP_BADREQUEST, why);
        return;
    }
    keep_setting(srv, type, DSP_SETTING_PAUSE, true, NULL);
    send_json(req, state_json(srv));
}

static void resume_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    char buf[300];
    const char *type;
    if (!post_allowed(req, srv) || query_type(req, buf, sizeof buf, &type) < 0 ||
        !type_allowed(req, srv, type))
        return;
    dsp_server_resume(srv, type);
    keep_setting(srv, type, type ? DSP_SETTING_PAUSE : DSP_SETTING_RESUME_ALL, false, NULL);
    send_json(req, state_json(srv));
}

/* ?concurrency=N, ?rate=R and ?per_group=G of POST /limit: digits only,
 * 0..DSP_LIMIT_MAX; one left out keeps its value. Returns 0, or -1 after a 400. */
static int query_limits(struct evhttp_request *req, uint32_t *concurrency, uint32_t *rate,
                        uint32_t *per_group)
{
    const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    struct evkeyvalq params;
    memset(&params, 0, sizeof params);
    params.tqh_last = &params.tqh_first;
    if (!q || evhttp_parse_query_str(q, &params) != 0) {
        send_error_text(req, HTTP_BADREQUEST, "bad query string");
        return -1;
    }
    static const char *const keys[3] = {"concurrency", "rate", "per_group"};
    uint32_t *fields[3] = {concurrency, rate, per_group};
    int rc = 0, given = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        const char *v = evhttp_find_header(&params, keys[k]);
        if (!v)
            continue;
        size_t n = strlen(v);
        uint64_t x = 0;
        for (size_t i = 0; i < n && x <= DSP_LIMIT_MAX; i++)
            x = v[i] >= '0' && v[i] <= '9' ? x * 10 + (uint64_t)(v[i] - '0') : UINT64_MAX;
        if (n == 0 || x > DSP_LIMIT_MAX) {
            send_error_text(req, HTTP_BADREQUEST,
                            "concurrency, rate and per_group are whole numbers from 0 to 1000000");
            rc = -1;
        } else {
            *fields[k] = (uint32_t)x;
            given++;
        }
    }
    if (rc == 0 && given == 0) {
        send_error_text(req, HTTP_BADREQUEST,
                        "give concurrency=N, rate=R and/or per_group=G (0: no limit)");
        rc = -1;
    }
    evhttp_clear_headers(&params);
    return rc;
}

static void limit_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    char buf[300];
    const char *type;
    if (!post_allowed(req, srv) || query_type(req, buf, sizeof buf, &type) < 0)
        return;
    if (!type) {
        send_error_text(req, HTTP_BADREQUEST, "a limit needs ?type=T");
        return;
    }
    if (!type_allowed(req, srv, type))
        return;
    const dsp_type_limit *old = dsp_limits_find(srv, type);
    uint32_t concurrency = old ? old->concurrency : 0, rate = old ? old->rate : 0;
    uint32_t per_group = old ? old->per_group : 0;
    if (query_limits(req, &concurrency, &rate, &per_group) < 0)
        return;
    const char *why = dsp_limits_set(srv, type, concurrency, rate, per_group, DSP_LIMIT_RUNTIME);
    if (why) {
        send_error_text(req, HTTP_BADREQUEST, why);
        return;
    }
    dsp_type_limit kept = {.concurrency = concurrency, .rate = rate, .per_group = per_group};
    keep_setting(srv, type, DSP_SETTING_LIMITS, false, &kept);
    send_json(req, json_pack("{s:b, s:s, s:I, s:I, s:I}", "ok", 1, "type", type, "concurrency",
                             (json_int_t)concurrency, "rate", (json_int_t)rate, "per_group",
                             (json_int_t)per_group));
}

/* GET /schedules: the periodic tasks as the schedule thread last read them (every
 * second, on a standby too), from memory (db_schedule.c). */
static void schedules_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!only_get(req))
        return;
    dsp_schedule_list *l = dsp_db_schedules_get(srv->db);
    if (!l) {
        evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
        return;
    }
    int64_t wall = dsp_wall_ms();
    json_t *a = json_array();
    for (size_t i = 0; i < l->n; i++) {
        const dsp_schedule_row *r = &l->rows[i];
        char *name = dsp_utf8_copy(r->name), *type = dsp_utf8_copy(r->type),
             *cron = dsp_utf8_copy(r->cron);
        json_t *o = json_pack("{s:s?, s:s?, s:i, s:o, s:o, s:s, s:I, s:I, s:o}", "name", name, "type", type,
                              "priority", (int)r->priority,
                              "interval_ms", r->interval_ms > 0 ? json_integer(r->interval_ms) : json_null(),
                              "cron", r->interval_ms > 0 || !cron ? json_null() : json_string(cron), "missed",
                              r->catch_up ? "catch-up" : "skip", "catch_up_max", (json_int_t)r->catch_up_max,
                              "next_run", (json_int_t)r->next_run, "next_run_in_ms",
                              r->next_run > 0 ? json_integer(r->next_run - wall) : json_null());
        if (o)
            json_array_append_new(a, o);
        free(name);
        free(type);
        free(cron);
    }
    json_t *body = json_pack("{s:b, s:I, s:b, s:I, s:b, s:o}", "valid", l->valid, "age_ms",
                             (json_int_t)(l->valid ? wall - l->read_wall_ms : -1), "leader",
                             srv->lead.leading && dsp_db_lease_valid(srv->db), "inserted_total",
                             (json_int_t)l->inserted_total, "cut", l->cut, "schedules", a);
    free(l);
    send_json(req, body);
}

static void drain_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!post_allowed(req, srv))
        return;
    dsp_server_drain(srv);
    json_t *o = state_json(srv);
    json_object_set_new(o, "in_flight", json_integer((json_int_t)srv->sched.ninflight));
    send_json(req, o);
}

static void requeue_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    char buf[300];
    const char *type;
    if (!post_allowed(req, srv) || query_type(req, buf, sizeof buf, &type) < 0)
        return;
    uint64_t id = dsp_server_requeue_failed(srv, type);
    if (id == 0) {
        evhttp_send_error(req, HTTP_INTERNAL, "cannot queue the request");
        return;
    }
    send_json_status(req, 202, "Accepted",
                     json_pack("{s:b, s:I, s:s?}", "ok", 1, "request_id", (json_int_t)id, "type", type));
}

/* ---- for admin_tasks.c ---- */

bool dsp_admin_only_get(struct evhttp_request *req)
{
    return only_get(req);
}

bool dsp_admin_post_allowed(struct evhttp_request *req, dsp_server *srv)
{
    return post_allowed(req, srv);
}

void dsp_admin_send_error(struct evhttp_request *req, int code, const char *text)
{
    send_error_text(req, code, text);
}

void dsp_admin_send_json(struct evhttp_request *req, int code, json_t *body)
{
    send_json_status(req, code, code == HTTP_OK ? "OK" : "Accepted", body);
}

/* ---- every request: the Host check, then its handler ---- */

/* True when name (a Host header or a URI's host, with or without :port) is
 * localhost, an address of 127.0.0.0/8 or [::1]. */
static bool loopback_host(const char *name)
{
    const char *end, *rest;
    if (name[0] == '[') {
        name++;
        if (!(end = strchr(name, ']')))
            return false;
        rest = end + 1;
    } else {
        end = name + strcspn(name, ":");
        rest = end;
    }
    if (*rest == ':')
        rest += 1 + strspn(rest + 1, "0123456789");
    char host[64];
    size_t n = (size_t)(end - name);
    if (*rest || n == 0 || n >= sizeof host)
        return false;
    memcpy(host, name, n);
    host[n] = '\0';
    struct in_addr a4;
    struct in6_addr a6;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return ntohl(a4.s_addr) >> 24 == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* DNS rebinding: a page of evil.example whose name then resolves to 127.0.0.1
 * reaches a loopback port from an operator's browser, but its requests still say
 * Host: evil.example. On a loopback bind only a loopback name can be right. A port
 * bound elsewhere is reached under names we cannot know (DNS, proxies, NAT), so it
 * is not checked there: the admin token protects it. A request without Host
 * (HTTP/1.0 tools) passes: browsers always send one. */
static bool host_allowed(struct evhttp_request *req, const dsp_server *srv)
{
    if (!srv->admin.loopback)
        return true;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Host");
    const char *uh = evhttp_uri_get_host(evhttp_request_get_evhttp_uri(req));
    if ((h && !loopback_host(h)) || (uh && !loopback_host(uh))) {
        send_error_text(req, 421,
                        "the Host header must name localhost, 127.0.0.1 or [::1] on this port");
        return false;
    }
    return true;
}

static const struct {
    const char *path;
    void (*handler)(struct evhttp_request *req, void *arg);
} routes[] = {
    {"/healthz", healthz_cb},   {"/stats", stats_cb},
    {"/workers", workers_cb},   {"/metrics", metrics_cb},
    {"/pause", pause_cb},       {"/resume", resume_cb},
    {"/drain", drain_cb},       {"/requeue-failed", requeue_cb},
    {"/", dsp_dashboard_serve}, {"/index.html", dsp_dashboard_serve},
    {"/task", dsp_admin_task_cb},     {"/failed", dsp_admin_failed_cb},
    {"/retry", dsp_admin_retry_cb},   {"/cancel", dsp_admin_cancel_cb},
    {"/retry-failed", dsp_admin_retry_failed_cb},
    {"/history", dsp_history_http_cb},
    {"/limit", limit_cb},       {"/schedules", schedules_cb},
    {"/keys", dsp_admin_keys_cb},     {"/progress", dsp_admin_progress_cb},
};

/* Every request comes here (no per-path evhttp callbacks), so that none skips
 * the Host check. Paths compare decoded, as evhttp_set_cb's would. */
/* ---- admin connections: a cap and a deadline for each whole request ----
 *
 * evhttp of libevent 2.1 has neither a connection limit nor a deadline for a whole
 * request (its timeout restarts at each byte: a peer trickling a header byte a second
 * holds its descriptor for ever). Each connection is known from its accept: evhttp asks
 * for its bufferevent (admin_bev_cb); once evhttp has made the connection around it, the
 * connection is found from the bufferevent (its callbacks' argument) and followed until
 * its close callback. Descriptors taken by such peers are the database's reconnects'. */

typedef struct dsp_admin_conn {
    struct bufferevent *bev;
    struct evhttp_connection *evcon; /* NULL until adopted */
    int64_t since_ms; /* accepted, or its last answer sent: the next request is due by then + timeout */
    bool busy;        /* a request is with its handler, not yet answered */
    struct dsp_admin_conn *prev, *next;
    /* Until its first bytes are seen (plaintext only): evhttp's read callback, held back
     * so that a worker's HELLO is recognised (admin_sniff_cb). */
    dsp_server *srv;
    bufferevent_data_cb http_readcb, http_writecb;
    bufferevent_event_cb http_eventcb;
} dsp_admin_conn;

/* A worker at the admin port: evhttp would wait for a request line a HELLO never ends,
 * and the worker for a WELCOME, each until a timeout. So the first bytes of a plaintext
 * connection are looked at before evhttp reads them (its read callback is held back
 * from adoption to then): a HELLO, whose length prefix starts with a zero byte as no
 * HTTP request does, is answered with an ERROR frame saying where workers connect, and
 * the rest is discarded until the worker closes (or the request deadline); anything else
 * is given to evhttp as it came. No copy, no filter layer on the connection's I/O. */
static void admin_discard_cb(struct bufferevent *bev, void *arg)
{
    (void)arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    evbuffer_drain(in, evbuffer_get_length(in));
}

static void admin_worker_answer(dsp_admin_conn *a)
{
    dsp_server *srv = a->srv;
    char peer[80] = "?", msg[700];
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    evutil_socket_t fd = bufferevent_getfd(a->bev);
    if (fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        char host[INET6_ADDRSTRLEN] = "?";
        bool v6 = ss.ss_family == AF_INET6;
        const void *ip = v6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                            : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
        inet_ntop(v6 ? AF_INET6 : AF_INET, ip, host, sizeof host);
        dsp_hostport_format(peer, sizeof peer, host,
                            ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port));
    }
    log_limited(&srv->log, &srv->conns.peer_log, dsp_now_ms(), DSP_LOG_WARN,
                "%s: a worker connected to the admin port; workers connect to --listen %s", peer,
                srv->listen_bound);
    snprintf(msg, sizeof msg, "this is taskpushd's admin HTTP port (--admin %s); workers connect to --listen %s",
             srv->admin_bound, srv->listen_bound);
    proto_msg m = {.type = PROTO_ERROR};
    m.u.error.code = PROTO_ERR_BAD_FRAME;
    m.u.error.message.ptr = (const uint8_t *)msg;
    m.u.error.message.len = strlen(msg);
    uint8_t frame[PROTO_LEN_PREFIX + 16 + sizeof msg];
    size_t n = proto_msg_encode(&m, frame, sizeof frame);
    admin_discard_cb(a->bev, NULL);
    /* evhttp's write callback is for its answers: none here. Its event callback is
     * back, so the worker's close frees the connection as any peer's does. */
    bufferevent_setcb(a->bev, admin_discard_cb, NULL, a->http_eventcb, a->evcon);
    if (n) {
        bufferevent_write(a->bev, frame, n);
        bufferevent_enable(a->bev, EV_WRITE);
    }
}

static void admin_sniff_cb(struct bufferevent *bev, void *arg)
{
    dsp_admin_conn *a = arg;
    uint8_t head[PROTO_LEN_PREFIX + 1];
    ev_ssize_t n = evbuffer_copyout(bufferevent_get_input(bev), head, sizeof head);
    if (n <= 0 || (head[0] == 0 && (size_t)n < sizeof head))
        return; /* at most four bytes more to decide; the request deadline holds */
    if (head[0] == 0 && proto_looks_like_hello(head, (size_t)n)) {
        admin_worker_answer(a);
        return;
    }
    bufferevent_data_cb readcb = a->http_readcb;
    struct evhttp_connection *evcon = a->evcon;
    bufferevent_setcb(bev, readcb, a->http_writecb, a->http_eventcb, evcon);
    readcb(bev, evcon); /* garbage too: evhttp refuses it as before */
}

/* While sniffing: evhttp's event callback, with its own argument (a close, a timeout). */
static void admin_sniff_event_cb(struct bufferevent *bev, short what, void *arg)
{
    dsp_admin_conn *a = arg;
    a->http_eventcb(bev, what, a->evcon); /* may free a */
}

static void admin_conn_unlink(dsp_server *srv, dsp_admin_conn *a)
{
    if (a->prev)
        a->prev->next = a->next;
    else
        srv->admin.conns = a->next;
    if (a->next)
        a->next->prev = a->prev;
    srv->admin.nconns--;
    free(a);
}

static dsp_admin_conn *admin_conn_of(dsp_server *srv, const struct evhttp_connection *evcon)
{
    for (dsp_admin_conn *a = srv->admin.conns; evcon && a; a = a->next)
        if (a->evcon == evcon)
            return a;
    return NULL;
}

static void admin_closed_cb(struct evhttp_connection *evcon, void *arg)
{
    dsp_server *srv = arg;
    dsp_admin_conn *a = admin_conn_of(srv, evcon);
    if (a)
        admin_conn_unlink(srv, a);
}

/* The connection that has waited longest for its request, other than keep, or NULL. A
 * connection whose request is with a handler is never chosen (its answer is due). */
static dsp_admin_conn *admin_oldest_idle(dsp_server *srv, const dsp_admin_conn *keep)
{
    dsp_admin_conn *oldest = NULL;
    for (dsp_admin_conn *a = srv->admin.conns; a; a = a->next)
        if (a != keep && a->evcon && !a->busy && (!oldest || a->since_ms <= oldest->since_ms))
            oldest = a;
    return oldest;
}

/* Runs after evhttp made its connections around the bufferevents of this pass's accepts. */
static void admin_adopt_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    for (dsp_admin_conn *a = srv->admin.conns, *next; a; a = next) {
        next = a->next;
        if (a->evcon)
            continue;
        void *cbarg = NULL;
        bufferevent_data_cb readcb = NULL, writecb = NULL;
        bufferevent_event_cb eventcb = NULL;
        bufferevent_getcb(a->bev, &readcb, &writecb, &eventcb, &cbarg);
        struct bufferevent *bev = a->bev;
        if (cbarg) {
            a->evcon = cbarg; /* evhttp's own argument to its bufferevent callbacks */
            evhttp_connection_set_closecb(a->evcon, admin_closed_cb, srv);
            /* Adopted in the loop pass of its accept, before its first read. */
            if (!srv->tls && readcb && eventcb && evbuffer_get_length(bufferevent_get_input(bev)) == 0) {
                a->srv = srv;
                a->http_readcb = readcb;
                a->http_writecb = writecb;
                a->http_eventcb = eventcb;
                bufferevent_setcb(bev, admin_sniff_cb, NULL, admin_sniff_event_cb, a);
            }
        } else {
            admin_conn_unlink(srv, a); /* evhttp failed to make it and freed it */
        }
        bufferevent_decref(bev); /* held since admin_bev_cb */
    }
    /* Over the cap: the connections that waited longest for their request go first, so
     * that a peer asking now (a probe's /healthz) is served whatever holds the others. */
    while ((int64_t)srv->admin.nconns > srv->cfg->admin_max_connections) {
        dsp_admin_conn *victim = admin_oldest_idle(srv, srv->admin.conns);
        if (!victim)
            victim = srv->admin.conns->evcon ? srv->admin.conns : NULL; /* all busy: the newest */
        if (!victim)
            break;
        log_limited(&srv->log, &srv->conns.peer_log, dsp_now_ms(), DSP_LOG_WARN, "%s",
                    "admin connection closed: --admin-max-connections reached");
        evhttp_connection_free(victim->evcon); /* admin_closed_cb unlinks it */
    }
}

static struct bufferevent *admin_bev_cb(struct event_base *base, void *arg)
{
    dsp_server *srv = arg;
    struct bufferevent *bev = srv->tls ? dsp_tls_http_bev_new(base, srv->tls->admin)
                                       : bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    dsp_admin_conn *a = bev ? calloc(1, sizeof *a) : NULL;
    if (!a)
        return bev; /* not followed: out of memory */
    /* Held until adopted, so that a connection evhttp fails to make is seen, not reused. */
    bufferevent_incref(bev);
    a->bev = bev;
    a->since_ms = dsp_now_ms();
    a->next = srv->admin.conns;
    if (a->next)
        a->next->prev = a;
    srv->admin.conns = a;
    srv->admin.nconns++;
    event_active(srv->admin.adopt_ev, EV_TIMEOUT, 0);
    return bev;
}

/* Closes every connection that has not sent a whole request within the deadline. */
static void admin_tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    int64_t now = dsp_now_ms();
    for (dsp_admin_conn *a = srv->admin.conns, *next; a; a = next) {
        next = a->next;
        if (a->evcon && !a->busy && now - a->since_ms > srv->cfg->admin_request_timeout_ms) {
            log_limited(&srv->log, &srv->conns.peer_log, now, DSP_LOG_INFO, "%s",
                        "admin connection closed: no whole request within --admin-request-timeout-ms");
            evhttp_connection_free(a->evcon); /* admin_closed_cb unlinks it */
        }
    }
}

static void admin_answered_cb(struct evhttp_request *req, void *arg)
{
    dsp_admin_conn *a = admin_conn_of(arg, evhttp_request_get_connection(req));
    if (a) {
        a->busy = false;
        a->since_ms = dsp_now_ms(); /* the next request has its own deadline */
    }
}

static void request_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    /* A whole request is here: its connection waits on us until it is answered. */
    dsp_admin_conn *ac = admin_conn_of(srv, evhttp_request_get_connection(req));
    if (ac) {
        ac->busy = true;
        evhttp_request_set_on_complete_cb(req, admin_answered_cb, srv);
    }
    if (!host_allowed(req, srv))
        return;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    char *decoded = path ? evhttp_uridecode(path, 0, NULL) : NULL;
    for (size_t i = 0; decoded && i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(decoded, routes[i].path) == 0) {
            free(decoded);
            routes[i].handler(req, srv);
            return;
        }
    free(decoded);
    send_error_text(req, HTTP_NOTFOUND, "no such path");
}

bool dsp_addr_is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24 == 127;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

int dsp_admin_http_new(dsp_server *srv)
{
    srv->admin.http = evhttp_new(srv->base);
    if (!srv->admin.http)
        return -1;
    /* A slow or oversized request costs only its own connection. */
    evhttp_set_max_headers_size(srv->admin.http, 16 * 1024);
    evhttp_set_max_body_size(srv->admin.http, 64 * 1024);
    evhttp_set_timeout(srv->admin.http, 10);
    evhttp_set_allowed_methods(srv->admin.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
    evhttp_set_gencb(srv->admin.http, request_cb, srv);
    /* Every accepted connection's bufferevent (TLS-wrapped with TLS) comes from here. */
    evhttp_set_bevcb(srv->admin.http, admin_bev_cb, srv);
    srv->admin.adopt_ev = event_new(srv->base, -1, 0, admin_adopt_cb, srv);
    srv->admin.tick_ev = event_new(srv->base, -1, EV_PERSIST, admin_tick_cb, srv);
    if (!srv->admin.adopt_ev || !srv->admin.tick_ev)
        return -1;
    int64_t tick = srv->cfg->admin_request_timeout_ms / 4;
    if (tick > 1000)
        tick = 1000;
    struct timeval tv = {(time_t)(tick / 1000), (suseconds_t)(tick % 1000 * 1000)};
    event_add(srv->admin.tick_ev, &tv);
    return 0;
}

void dsp_admin_http_free(dsp_server *srv)
{
    if (srv->admin.http) /* closes every connection: admin_closed_cb unlinks the adopted ones */
        evhttp_free(srv->admin.http);
    srv->admin.http = NULL;
    while (srv->admin.conns) { /* accepted in the last pass, not adopted */
        struct bufferevent *bev = srv->admin.conns->evcon ? NULL : srv->admin.conns->bev;
        admin_conn_unlink(srv, srv->admin.conns);
        if (bev)
            bufferevent_decref(bev);
    }
    if (srv->admin.adopt_ev)
        event_free(srv->admin.adopt_ev);
    if (srv->admin.tick_ev)
        event_free(srv->admin.tick_ev);
    srv->admin.adopt_ev = srv->admin.tick_ev = NULL;
}

int dsp_admin_init(dsp_server *srv, char *bound, size_t boundlen)
{
    char host[256];
    unsigned port;
    if (dsp_hostport_parse(srv->cfg->admin, host, sizeof host, &port) < 0 || dsp_admin_http_new(srv) < 0)
        return -1;
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(srv->admin.http, host, (ev_uint16_t)port);
    if (!bs) {
        log_error(&srv->log, "--admin %s: cannot listen there", srv->cfg->admin);
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    memset(&ss, 0, sizeof ss);
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl);
    srv->admin.loopback = dsp_addr_is_loopback(&ss);
    unsigned real = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    dsp_hostport_format(bound, boundlen, host, real);
    return 0;
}
