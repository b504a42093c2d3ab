/* server_status.c: what is measured around a drain. The server's own counters
 * (SHOW GLOBAL STATUS deltas), CPU time of mariadbd, taskpushd and the bench from
 * /proc (procfs.c), and a GET of taskpushd's admin port parsed as JSON. */
#include "bench.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* "SQL statements" of a design: the data statements and the transaction controls,
 * counted by the server. SHOW (Com_show_*) and SELECT @@var (Com_select, but only
 * read outside the measured window) stay out; implicit commits of autocommit
 * statements are not statements. */
static const char *const stmt_counters[] = {
    "Com_select",        "Com_insert", "Com_insert_select", "Com_update", "Com_update_multi",
    "Com_delete",        "Com_delete_multi", "Com_replace", "Com_begin", "Com_commit",
    "Com_rollback",
};

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int bench_snap_take(bench_ctx *ctx, pid_t tpd_pid, bench_snap *s)
{
    memset(s, 0, sizeof *s);
    if (mysql_query(ctx->admin,
                    "SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Com\\_%'"
                    " OR Variable_name LIKE 'Handler\\_read\\_%'"
                    " OR Variable_name = 'Innodb_row_lock_waits'") != 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(ctx->admin);
    if (res == NULL)
        return -1;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res)) != NULL) {
        if (row[0] == NULL || row[1] == NULL)
            continue;
        uint64_t v = strtoull(row[1], NULL, 10);
        if (strcmp(row[0], "Innodb_row_lock_waits") == 0)
            s->lock_waits = v;
        else if (strncasecmp(row[0], "Handler_read_", 13) == 0)
            s->handler_reads += v; /* index and row reads of the handler interface */
        for (size_t i = 0; i < sizeof stmt_counters / sizeof stmt_counters[0]; i++)
            if (strcasecmp(row[0], stmt_counters[i]) == 0)
                s->statements += v;
    }
    mysql_free_result(res);
    s->db_cpu = procfs_cpu_seconds(ctx->db_pid);
    s->tpd_cpu = procfs_cpu_seconds(tpd_pid);
    s->bench_cpu = procfs_cpu_seconds(getpid());
    s->t = bench_now();
    return 0;
}

void bench_snap_delta(const bench_snap *a, const bench_snap *b, bench_run *r)
{
    r->seconds = b->t - a->t;
    r->statements = b->statements >= a->statements ? b->statements - a->statements : 0;
    r->lock_waits = b->lock_waits >= a->lock_waits ? b->lock_waits - a->lock_waits : 0;
    r->handler_reads = b->handler_reads >= a->handler_reads ? b->handler_reads - a->handler_reads : 0;
    r->db_cpu_s = a->db_cpu >= 0 && b->db_cpu >= 0 ? b->db_cpu - a->db_cpu : -1;
    r->tpd_cpu_s = a->tpd_cpu >= 0 && b->tpd_cpu >= 0 ? b->tpd_cpu - a->tpd_cpu : -1;
    r->bench_cpu_s = a->bench_cpu >= 0 && b->bench_cpu >= 0 ? b->bench_cpu - a->bench_cpu : -1;
}

/* One answer of the admin port. */
struct http_reply {
    struct event_base *base;
    int status;
    char *body;
};

static void http_done(struct evhttp_request *req, void *arg)
{
    struct http_reply *r = arg;
    if (req != NULL && evhttp_request_get_response_code(req) > 0) {
        r->status = evhttp_request_get_response_code(req);
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        size_t n = evbuffer_get_length(in);
        if (n <= 16u * 1024 * 1024 && (r->body = malloc(n + 1)) != NULL) {
            evbuffer_remove(in, r->body, n);
            r->body[n] = '\0';
        }
    }
    event_base_loopexit(r->base, NULL); /* a kept-alive connection would hold the loop */
}

json_t *bench_http_json(const char *hostport, const char *path)
{
    char host[128];
    const char *colon = strrchr(hostport, ':');
    if (colon == NULL || (size_t)(colon - hostport) >= sizeof host)
        return NULL;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    long port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535)
        return NULL;

    json_t *out = NULL;
    struct http_reply r = {event_base_new(), -1, NULL};
    if (r.base == NULL)
        return NULL;
    struct evhttp_connection *conn =
        evhttp_connection_base_new(r.base, NULL, host, (unsigned short)port);
    struct evhttp_request *req = conn ? evhttp_request_new(http_done, &r) : NULL;
    if (req != NULL) {
        evhttp_connection_set_timeout(conn, 10);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
        if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, path) == 0)
            event_base_dispatch(r.base);
    }
    if (conn)
        evhttp_connection_free(conn);
    event_base_free(r.base);
    if (r.status == 200 && r.body != NULL)
        out = json_loads(r.body, 0, NULL);
    free(r.body);
    return out;
}

long long bench_json_int(json_t *root, const char *dotted)
{
    json_t *cur = root;
    char key[128];
    for (const char *p = dotted; cur != NULL && *p;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof key)
            return -1;
        memcpy(key, p, n);
        key[n] = '\0';
        cur = json_object_get(cur, key);
        p = dot ? dot + 1 : p + n;
    }
    return json_is_integer(cur) ? (long long)json_integer_value(cur) : -1;
}
