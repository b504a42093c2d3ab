/* server_status.c: what is measured around a drain. The server's own counters
 * (SHOW GLOBAL STATUS deltas), CPU time and peak RSS of mariadbd and taskpushd from
 * /proc, and a GET of taskpushd's admin port parsed as JSON. */
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

double bench_proc_cpu(pid_t pid)
{
    char path[64], buf[1024];
    if (pid <= 0)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* The command name may hold spaces and ')': fields resume after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -1;
    unsigned long long ut = 0, st = 0;
    /* After ") ": state(3) ... utime is field 14, stime 15. */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(ut + st) / (double)hz : -1;
}

/* The value of the line "Key:\tvalue" of /proc/PID/status, without the blanks before
 * it, into buf: 0, or -1 when the process, the key or room for the value is missing. */
static int proc_status_value(pid_t pid, const char *key, char *buf, size_t len)
{
    char path[64], line[512];
    size_t klen = strlen(key);
    int rc = -1;
    if (pid <= 0 || len == 0)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0 || line[klen] != ':')
            continue;
        const char *v = line + klen + 1;
        v += strspn(v, " \t");
        size_t n = strcspn(v, "\n");
        if (n > 0 && n < len) {
            memcpy(buf, v, n);
            buf[n] = '\0';
            rc = 0;
        }
        break;
    }
    fclose(f);
    return rc;
}

/* One "Key: N kB" line of /proc/PID/status; < 0 unknown. */
static long proc_status_kb(pid_t pid, const char *key)
{
    char v[64];
    long kb;
    if (proc_status_value(pid, key, v, sizeof v) < 0 || sscanf(v, "%ld kB", &kb) != 1)
        return -1;
    return kb;
}

int bench_proc_cpus_allowed(pid_t pid, char *buf, size_t len)
{
    return proc_status_value(pid, "Cpus_allowed_list", buf, len);
}

long bench_proc_hwm_kb(pid_t pid)
{
    return proc_status_kb(pid, "VmHWM");
}

long bench_proc_rss_kb(pid_t pid)
{
    return proc_status_kb(pid, "VmRSS");
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
    s->db_cpu = bench_proc_cpu(ctx->db_pid);
    s->tpd_cpu = bench_proc_cpu(tpd_pid);
    s->bench_cpu = bench_proc_cpu(getpid());
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
