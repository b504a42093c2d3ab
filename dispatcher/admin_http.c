/* admin_http.c: the admin port on evhttp, on the dispatcher's own loop.
 * Every handler answers from memory; nothing here touches the database. */
#include "conn.h"
#include "server.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <jansson.h>

#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static void send_json(struct evhttp_request *req, json_t *body)
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
    evhttp_send_reply(req, HTTP_OK, "OK", out);
    evbuffer_free(out);
}

static bool only_get(struct evhttp_request *req)
{
    if (evhttp_request_get_command(req) == EVHTTP_REQ_GET)
        return true;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
    evhttp_send_error(req, 405, "use GET");
    return false;
}

static void healthz_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!only_get(req))
        return;
    struct evbuffer *out = evbuffer_new();
    bool ok = srv->db_connected;
    evbuffer_add_printf(out, "%s\n", ok ? "ok" : "database unreachable");
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain");
    evhttp_send_reply(req, ok ? HTTP_OK : 503, ok ? "OK" : "Service Unavailable", out);
    evbuffer_free(out);
}

static void add_setting(void *arg, const char *key, const char *val)
{
    json_object_set_new(arg, key, json_string(val));
}

static json_t *stats_json(dsp_server *srv)
{
    json_t *tasks = json_object();
#define X(name, help) json_object_set_new(tasks, #name, json_integer((json_int_t)srv->task_stats.name));
    DSP_TASK_COUNTERS(X)
#undef X
    json_t *conns = json_object();
#define X(name, help) json_object_set_new(conns, #name, json_integer((json_int_t)srv->conn_stats.name));
    DSP_CONN_COUNTERS(X)
#undef X
    json_object_set_new(conns, "open", json_integer((json_int_t)srv->nconns));

    dsp_db_counters dbc;
    dsp_db_counters_get(srv->db, &dbc);
    json_t *db = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "statements_total",
                           (json_int_t)dbc.statements, "claims_total", (json_int_t)dbc.claims,
                           "claimed_rows_total", (json_int_t)dbc.claimed_rows, "claim_us_total",
                           (json_int_t)dbc.claim_us_total, "write_batches_total",
                           (json_int_t)dbc.write_batches, "reconnects_total",
                           (json_int_t)dbc.reconnects, "pending_writes",
                           (json_int_t)dsp_db_pending_writes(srv->db));
    json_t *settings = json_object();
    dsp_config_each(srv->cfg, add_setting, settings);

    return json_pack("{s:I, s:b, s:b, s:I, s:s, s:I, s:b, s:o, s:{s:I, s:I}, s:o, s:o, s:o}",
                     "uptime_s", (json_int_t)((dsp_now_ms() - srv->started_ms) / 1000),
                     "db_connected", srv->db_connected, "leader", srv->leader, "epoch",
                     (json_int_t)srv->epoch, "scheduler", dsp_sched_policy_name(srv->cfg->scheduler),
                     "workers", (json_int_t)srv->nworkers, "draining", srv->draining, "tasks", tasks,
                     "queue", "buffered", (json_int_t)srv->nbuffered, "in_flight",
                     (json_int_t)srv->ninflight, "connections", conns, "db", db, "settings", settings);
}

static void stats_cb(struct evhttp_request *req, void *arg)
{
    if (only_get(req))
        send_json(req, stats_json(arg));
}

static void workers_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!only_get(req))
        return;
    json_t *list = json_array();
    int64_t now = dsp_now_ms();
    for (dsp_conn *c = srv->conns; c; c = c->next) {
        if (c->state != DSP_CONN_ACTIVE)
            continue;
        json_t *types = json_array();
        for (size_t i = 0; i < c->ntypes; i++)
            json_array_append_new(types, json_string(c->types[i]->name));
        json_array_append_new(
            list, json_pack("{s:s, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:b}", "name", c->name, "addr",
                            c->addr, "types", types, "capacity", (json_int_t)c->slots.capacity,
                            "in_flight", (json_int_t)c->slots.in_flight, "completed_total",
                            (json_int_t)c->completed_total, "delivered_total",
                            (json_int_t)c->delivered_total, "connected_s",
                            (json_int_t)((now - c->connected_ms) / 1000), "accepting",
                            c->slots.accepting));
    }
    send_json(req, list);
}

static void not_found_cb(struct evhttp_request *req, void *arg)
{
    (void)arg;
    evhttp_send_error(req, HTTP_NOTFOUND, "no such path");
}

int dsp_admin_init(dsp_server *srv, char *bound, size_t boundlen)
{
    char host[256];
    unsigned port;
    if (dsp_hostport_parse(srv->cfg->admin, host, sizeof host, &port) < 0)
        return -1;
    srv->http = evhttp_new(srv->base);
    if (!srv->http)
        return -1;
    /* A slow or oversized request costs only its own connection. */
    evhttp_set_max_headers_size(srv->http, 16 * 1024);
    evhttp_set_max_body_size(srv->http, 64 * 1024);
    evhttp_set_timeout(srv->http, 10);
    evhttp_set_allowed_methods(srv->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
    evhttp_set_cb(srv->http, "/healthz", healthz_cb, srv);
    evhttp_set_cb(srv->http, "/stats", stats_cb, srv);
    evhttp_set_cb(srv->http, "/workers", workers_cb, srv);
    evhttp_set_gencb(srv->http, not_found_cb, srv);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(srv->http, host, (ev_uint16_t)port);
    if (!bs) {
        log_error(&srv->log, "--admin %s: cannot listen there", srv->cfg->admin);
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl);
    unsigned real = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    snprintf(bound, boundlen, "%s:%u", host, real);
    return 0;
}
