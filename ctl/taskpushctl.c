/* taskpushctl: the operator's view of a running taskpushd, over its admin port.
 *
 *   taskpushctl [--admin HOST:PORT] [--json] stats|workers|health
 *   taskpushctl [--admin HOST:PORT] [--json] [--admin-token-file PATH | --token-file PATH]
 *               [--type T [--force]] pause|resume|drain|requeue-failed
 *   taskpushctl [--admin HOST:PORT] [--json] show ID | failed [--type T] [--limit N]
 *   taskpushctl [--admin HOST:PORT] [--json] [--admin-token-file PATH | --token-file PATH]
 *               retry ID | cancel ID
 *   taskpushctl [--worker HOST:PORT] submit --type T ... < payload   (ctl_submit.c)
 *   --admin also takes http://HOST:PORT, and https://HOST:PORT, which, like
 *   --tls, speaks TLS (verified against --tls-ca or the system's CAs).
 *
 * Exit status: 0 when the dispatcher answered (for health: answered healthy;
 * for a request: accepted it), 1 when it is unhealthy, refused or did not
 * answer, 2 for a bad command line. */
#include "ctl_submit.h"
#include "tls.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>
#include <openssl/ssl.h>

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct ctl_reply {
    int status; /* HTTP status, -1 when no answer */
    char *body;
    char why[320]; /* with no answer: the TLS failure, when there was one */
    struct event_base *base; /* the request's loop, ended by reply_cb */
} ctl_reply;

/* Where and how to reach the admin port. */
typedef struct ctl_target {
    const char *admin; /* as given, for messages */
    char host[256];
    unsigned short port;
    SSL_CTX *tls;      /* NULL: plain HTTP */
} ctl_target;

static void reply_cb(struct evhttp_request *req, void *arg)
{
    ctl_reply *r = arg;
    /* The answer is complete (or the request failed): end the loop now. The connection
     * is kept alive and would hold event_base_dispatch until its timeout. */
    event_base_loopbreak(r->base);
    if (!req || evhttp_request_get_response_code(req) <= 0)
        return;
    r->status = evhttp_request_get_response_code(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    if ((r->body = malloc(n + 1))) {
        evbuffer_remove(in, r->body, n);
        r->body[n] = '\0';
    }
}

/* Splits [http://|https://]HOST:PORT[/] (HOST may be [v6]); https:// turns TLS on.
 * Returns 0, or -1 with what is wrong in why (a path, a scheme, a port, a host). */
static int parse_admin(const char *admin, ctl_target *t, bool *tls, char *why, size_t whylen)
{
    const char *p = admin, *scheme = strstr(admin, "://");
    if (strncmp(p, "https://", 8) == 0) {
        *tls = true;
        p += 8;
    } else if (strncmp(p, "http://", 7) == 0) {
        p += 7;
    } else if (scheme) {
        snprintf(why, whylen, "unknown scheme '%.*s://' (http:// or https:// only)",
                 (int)(scheme - admin < 32 ? scheme - admin : 32), admin);
        return -1;
    }
    /* Only the port is asked for: a path, query or user name would be dropped silently. */
    size_t n = strcspn(p, "/?#@");
    if (p[n] == '@') {
        snprintf(why, whylen, "a user name is not taken (give HOST:PORT)");
        return -1;
    }
    if (p[n] && strcmp(p + n, "/") != 0) {
        snprintf(why, whylen, "a path or query ('%.64s') is not taken (give HOST:PORT)", p + n);
        return -1;
    }
    const char *h = p, *colon = NULL;
    size_t hl;
    if (h[0] == '[') { /* [v6]:PORT */
        const char *rb = memchr(h, ']', n);
        if (!rb || rb + 1 == p + n || rb[1] != ':') {
            snprintf(why, whylen, "no port after the IPv6 address (give [ADDR]:PORT)");
            return -1;
        }
        colon = rb + 1;
        h++;
        hl = (size_t)(rb - h);
    } else {
        colon = memchr(h, ':', n);
        hl = colon ? (size_t)(colon - h) : n;
        if (colon && memchr(colon + 1, ':', (size_t)(p + n - colon - 1))) {
            snprintf(why, whylen, "write an IPv6 address as [ADDR]:PORT");
            return -1;
        }
    }
    if (hl == 0) {
        snprintf(why, whylen, "the host is empty");
        return -1;
    }
    if (hl >= sizeof t->host || strcspn(h, " \t") < hl) {
        snprintf(why, whylen, "the host is too long or has white space");
        return -1;
    }
    if (!colon) {
        snprintf(why, whylen, "no port (give HOST:PORT)");
        return -1;
    }
    /* Digits only: strtol would also take "+80" or " 80". */
    const char *ps = colon + 1;
    size_t pl = (size_t)(p + n - ps);
    long port = 0;
    for (size_t i = 0; i < pl && port <= 65535; i++)
        port = ps[i] >= '0' && ps[i] <= '9' ? port * 10 + (ps[i] - '0') : 65536;
    if (pl == 0 || port < 1 || port > 65535) {
        snprintf(why, whylen, "the port '%.*s' is not a number from 1 to 65535", (int)(pl < 16 ? pl : 16), ps);
        return -1;
    }
    memcpy(t->host, h, hl);
    t->host[hl] = '\0';
    t->port = (unsigned short)port;
    return 0;
}

static ctl_reply http_request(const ctl_target *t, enum evhttp_cmd_type method, const char *path,
                              const char *token)
{
    ctl_reply r = {.status = -1};
    struct event_base *base = r.base = event_base_new();
    struct bufferevent *bev = NULL;
    if (base && t->tls && !(bev = dsp_tls_connect_bev_new(base, t->tls, t->host))) {
        event_base_free(base);
        r.base = NULL;
        snprintf(r.why, sizeof r.why, "cannot set up TLS for %s", t->host);
        return r;
    }
    struct evhttp_connection *conn =
        base ? evhttp_connection_base_bufferevent_new(base, NULL, bev, t->host, t->port) : NULL;
    struct evhttp_request *req = conn ? evhttp_request_new(reply_cb, &r) : NULL;
    if (req) {
        evhttp_connection_set_timeout(conn, 5);
        /* An IPv6 host goes in brackets, or taskpushd cannot read it (it checks Host). */
        char host[300];
        snprintf(host, sizeof host, strchr(t->host, ':') ? "[%s]:%u" : "%s:%u", t->host, t->port);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
        /* taskpushd refuses a POST a browser could send cross-origin without asking. */
        if (method == EVHTTP_REQ_POST)
            evhttp_add_header(evhttp_request_get_output_headers(req), "X-Taskpush-Admin", "1");
        if (token) {
            size_t n = strlen(token) + 8;
            char *auth = malloc(n);
            if (auth) {
                snprintf(auth, n, "Bearer %s", token);
                evhttp_add_header(evhttp_request_get_output_headers(req), "Authorization", auth);
                free(auth);
            }
        }
        if (evhttp_make_request(conn, req, method, path) == 0)
            event_base_dispatch(base);
    }
    if (r.status < 0 && conn)
        dsp_tls_error_text(evhttp_connection_get_bufferevent(conn), r.why, sizeof r.why);
    if (conn)
        evhttp_connection_free(conn);
    if (base)
        event_base_free(base);
    r.base = NULL;
    return r;
}

/* Writes the strings of a JSON array as "a,b,c" into buf (cut at a whole
 * element when it does not fit); returns the length written. */
static size_t join_strings(json_t *array, char *buf, size_t cap)
{
    size_t i, used = 0;
    json_t *item;
    buf[0] = '\0';
    json_array_foreach(array, i, item) {
        int n = snprintf(buf + used, cap - used, "%s%s", i ? "," : "", json_string_value(item));
        if (n < 0 || (size_t)n >= cap - used) {
            buf[used] = '\0';
            break;
        }
        used += (size_t)n;
    }
    return used;
}

static long long num(json_t *o, const char *key)
{
    return (long long)json_integer_value(json_object_get(o, key));
}

static double real(json_t *o, const char *key)
{
    return json_number_value(json_object_get(o, key));
}

static void print_stats(json_t *s)
{
    json_t *t = json_object_get(s, "tasks"), *q = json_object_get(s, "queue");
    printf("database    %s", json_is_true(json_object_get(s, "db_connected")) ? "reachable" : "UNREACHABLE");
    if (json_is_true(json_object_get(s, "leader")))
        printf(", leading the table with epoch %lld\n", num(s, "epoch"));
    else
        printf(", waiting for the table\n");
    /* --table NAME: which queue this is, when several share a database. */
    const char *tname = json_string_value(json_object_get(s, "task_table"));
    if (tname)
        printf("task table  %s\n", tname);
    printf("uptime      %lld s\n", num(s, "uptime_s"));
    printf("scheduler   %s\n", json_string_value(json_object_get(s, "scheduler")));
    json_t *wk = json_object_get(s, "wake");
    if (json_is_object(wk)) /* how inserted rows are noticed (--wake) */
        printf("wake        %s: %s (%lld wakes, %lld events)\n",
               json_string_value(json_object_get(wk, "mode")) ? json_string_value(json_object_get(wk, "mode")) : "?",
               json_string_value(json_object_get(wk, "reason")) ? json_string_value(json_object_get(wk, "reason")) : "",
               num(wk, "wakes_total"), num(wk, "events_total"));
    printf("workers     %lld\n", num(s, "workers"));
    printf("queue       %lld buffered, %lld in flight\n", num(q, "buffered"), num(q, "in_flight"));
    printf("tasks       %lld claimed, %lld dispatched, %lld succeeded, %lld failed,\n"
           "            %lld retried, %lld requeued\n",
           num(t, "claimed_total"), num(t, "dispatched_total"), num(t, "succeeded_total"),
           num(t, "failed_total"), num(t, "retried_total"), num(t, "requeued_total"));
    json_t *r = json_object_get(s, "rates");
    json_t *rd = json_object_get(r, "dispatched_per_s"), *rc = json_object_get(r, "completed_per_s");
    if (rd && rc)
        printf("rates       dispatched %.1f/s, completed %.1f/s (1 s); %.1f/s, %.1f/s (10 s); "
               "%.1f/s, %.1f/s (60 s)\n",
               real(rd, "1s"), real(rc, "1s"), real(rd, "10s"), real(rc, "10s"), real(rd, "60s"),
               real(rc, "60s"));
    json_t *p = json_object_get(s, "paused");
    bool draining = json_is_true(json_object_get(s, "draining"));
    if (p) {
        char types[512];
        size_t used = join_strings(json_object_get(p, "types"), types, sizeof types);
        printf("state       %s%s%s%s\n", json_is_true(json_object_get(p, "all")) ? "PAUSED" : "running",
               used ? ", paused types: " : "", types, draining ? ", DRAINING" : "");
    }
    json_t *tb = json_object_get(s, "table");
    if (json_is_true(json_object_get(tb, "valid"))) {
        json_t *bs = json_object_get(tb, "by_state"), *bp = json_object_get(tb, "new_by_priority");
        long long lag = num(tb, "oldest_ready_age_ms");
        printf("table       %lld new (%lld high, %lld normal, %lld low), %lld processing,\n"
               "            %lld%s successful, %lld failed; figures %lld ms old\n",
               num(bs, "new"), num(bp, "high"), num(bp, "normal"), num(bp, "low"), num(bs, "processing"),
               num(bs, "successful"), json_is_true(json_object_get(tb, "successful_capped")) ? "+" : "",
               num(bs, "failed"), num(tb, "age_ms"));
        if (lag >= 0)
            printf("queue lag   %.3f s (oldest ready task)\n", (double)lag / 1000.0);
        else
            printf("queue lag   none (no ready task)\n");
        size_t i;
        json_t *ty;
        json_array_foreach(json_object_get(tb, "types"), i, ty) {
            if (i == 0)
                printf("  %-24s %10s %10s %10s %10s\n", "TYPE", "READY", "DELAYED", "PROCESSING", "FAILED");
            printf("  %-24s %10lld %10lld %10lld %10lld\n", json_string_value(json_object_get(ty, "type")),
                   num(ty, "new_ready"), num(ty, "new_delayed"), num(ty, "processing"), num(ty, "failed"));
        }
    } else if (tb) {
        printf("table       (figures not read yet)\n");
    }
    json_t *lr = json_object_get(s, "last_requeue");
    if (json_is_object(lr)) {
        const char *st = json_string_value(json_object_get(lr, "state"));
        printf("requeue     request %lld%s%s: %s", num(lr, "request_id"),
               *json_string_value(json_object_get(lr, "type")) ? " of type " : "",
               json_string_value(json_object_get(lr, "type")), st ? st : "?");
        if (st && strcmp(st, "done") == 0)
            printf(", %lld row(s) back to NEW", num(lr, "rows"));
        printf("\n");
    }
}

/* Reads the token of --admin-token-file or --token-file (flag): the first line,
 * without its newline. */
static char *read_token(const char *flag, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "taskpushctl: %s %s: %s\n", flag, path, strerror(errno));
        return NULL;
    }
    char buf[2048];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (!buf[0]) {
        fprintf(stderr, "taskpushctl: %s %s: empty\n", flag, path);
        return NULL;
    }
    return strdup(buf);
}

static void print_workers(json_t *list)
{
    printf("%-24s %-22s %8s %9s %10s %8s  %s\n", "NAME", "ADDRESS", "CAPACITY", "IN FLIGHT",
           "COMPLETED", "UP (s)", "TYPES");
    size_t i;
    json_t *w;
    json_array_foreach(list, i, w) {
        char types[256];
        join_strings(json_object_get(w, "types"), types, sizeof types);
        printf("%-24s %-22s %8lld %9lld %10lld %8lld  %s\n", json_string_value(json_object_get(w, "name")),
               json_string_value(json_object_get(w, "addr")), num(w, "capacity"), num(w, "in_flight"),
               num(w, "completed_total"), num(w, "connected_s"), types);
    }
    if (json_array_size(list) == 0)
        printf("(no worker connected)\n");
}

static void usage(FILE *out)
{
    fprintf(out, "Usage: taskpushctl [--admin HOST:PORT] [--tls [--tls-ca PEM]] [--json] COMMAND\n"
                 "Shows a running taskpushd through its admin port.\n\n"
                 "Commands:\n"
                 "  stats     counters, queue and database state\n"
                 "  workers   connected workers and their load\n"
                 "  schedules periodic tasks (table task_schedule) and their next run\n"
                 "  health    'ok' and exit 0 while the database is reachable, else exit 1\n"
                 "  pause     stop claiming and dispatching (all types, or --type T)\n"
                 "  resume    undo pause (all types, or --type T); also ends a drain\n"
                 "  drain     stop claiming, put buffered tasks back to NEW, let in-flight\n"
                 "            tasks finish; the dispatcher keeps running until resume\n"
                 "  requeue-failed   move FAILED rows (all, or of --type T) back to NEW\n"
                 "  show ID   one task: state, attempts, times, err_msg, result size, its worker,\n"
                 "            what it waits for (dependencies)\n"
                 "  failed    the latest failures, by when they failed, with their err_msg (--type T, --limit N)\n"
                 "  retry ID  a FAILED task back to NEW with attempts 0\n"
                 "  cancel ID a NEW, buffered or running task becomes FAILED \"cancelled\"\n"
                 "  submit    insert one task through the worker port; the payload is standard\n"
                 "            input; prints its id, or \"duplicate ID\" (see below)\n\n"
                 "Options (before or after the command; submit takes --admin and ignores it):\n"
                 "  --type T            only task type T (pause, resume, requeue-failed, failed)\n"
                 "  --limit N           failed: at most N tasks, 1 to 1000 (default 20)\n"
                 "  --force             pause/resume --type T: even a type no worker registered\n"
                 "                      and the table has no rows of\n"
                 "  --admin-token-file PATH\n"
                 "                      bearer token for pause/resume/drain/requeue-failed\n"
                 "                      (default: TASKPUSH_ADMIN_TOKEN)\n"
                 "  --token-file PATH   the workers' token instead, for a taskpushd without an\n"
                 "                      admin token of its own (default: TASKPUSH_TOKEN)\n"
                 "  --admin HOST:PORT   the admin port (default 127.0.0.1:7071, or TASKPUSH_ADMIN);\n"
                 "                      also http://HOST:PORT, or https://HOST:PORT for TLS\n"
                 "  --tls               speak TLS to the admin port (taskpushd --tls-cert)\n"
                 "  --tls-ca PEM        trust this CA for the dispatcher's certificate\n"
                 "                      (default: the system's CAs); the certificate must name HOST\n"
                 "  --json              print the dispatcher's JSON as it is (for scripts)\n"
                 "submit options:\n"
                 "  --worker HOST:PORT  the worker port (default 127.0.0.1:7070, or TASKPUSH_WORKER);\n"
                 "                      --token-file is then the workers' token, --tls its TLS\n"
                 "  --type T            the task type (required)\n"
                 "  --priority P        0 low, 1 normal (default), 2 high\n"
                 "  --dedup-key K       idempotency key: while a row has it, answered \"duplicate ID\"\n"
                 "  --group-key K       fair share: within a type and priority, keys take turns\n"
                 "                      (1 to 191 bytes)\n"
                 "  --after ID[,ID...]  wait for these tasks: run once all are SUCCESSFUL, FAILED\n"
                 "                      (err_msg 'dependency ...') when one fails; at most 1000\n"
                 "  --delay-ms N        not run before N ms from now\n"
                 "  --max-attempts N    1 to 1000 (default: the table's, 3)\n"
                 "  --timeout-ms N      the lease of one attempt (default: the dispatcher's)\n"
                 "  --wait              also wait for the final state; print it and the result\n"
                 "  --wait-ms N         give up after N ms (default 30000)\n"
                 "  -h, --help          show this help\n"
                 "  --version           show the version\n");
}

/* pause|resume|drain|requeue-failed. */
static void no_answer(const ctl_target *t, const ctl_reply *r)
{
    fprintf(stderr, "taskpushctl: no answer from %s%s%s\n", t->admin, r->why[0] ? ": " : "", r->why);
}

static void print_task_action(const char *cmd, json_t *o);

static int run_post(const ctl_target *t, const char *cmd, const char *path, const char *type,
                    const char *admin_token_file, const char *token_file, bool as_json, bool force)
{
    const char *admin = t->admin;
    /* As taskpushd: the admin token when given, else the workers'; flags before the
     * environment. */
    char *token = NULL;
    const char *env_admin = getenv("TASKPUSH_ADMIN_TOKEN"), *env_worker = getenv("TASKPUSH_TOKEN");
    if (admin_token_file || token_file) {
        if (!(token = admin_token_file ? read_token("--admin-token-file", admin_token_file)
                                       : read_token("--token-file", token_file)))
            return 2;
    } else if (env_admin && *env_admin) {
        token = strdup(env_admin);
    } else if (env_worker && *env_worker) {
        token = strdup(env_worker);
    }
    char url[1024];
    char *enc = type ? evhttp_encode_uri(type) : NULL;
    snprintf(url, sizeof url, "%s%s%s%s", path, enc ? "?type=" : "", enc ? enc : "",
             force ? (enc ? "&force=1" : "?force=1") : "");
    free(enc);
    ctl_reply r = http_request(t, EVHTTP_REQ_POST, url, token);
    free(token);
    int rc = 1;
    json_t *o = r.body ? json_loads(r.body, 0, NULL) : NULL;
    if (r.status < 0) {
        no_answer(t, &r);
    } else if (as_json) {
        if (o)
            printf("%s", r.body);
        else
            printf("{\"ok\":false,\"status\":%d}\n", r.status);
        rc = r.status / 100 == 2 ? 0 : 1;
    } else if (r.status == 401) {
        fprintf(stderr,
                "taskpushctl: %s refused %s: a valid token is needed (--admin-token-file or "
                "TASKPUSH_ADMIN_TOKEN; --token-file or TASKPUSH_TOKEN without an admin token)\n",
                admin, cmd);
    } else if (r.status / 100 != 2 || !o) {
        /* The dispatcher's text says what was wrong (e.g. a Host it refuses). */
        if (r.body && !o && *r.body)
            fprintf(stderr, "taskpushctl: %s refused %s: %.*s\n", admin, cmd, (int)strcspn(r.body, "\r\n"),
                    r.body);
        else
            fprintf(stderr, "taskpushctl: %s answered %d to %s\n", admin, r.status, cmd);
    } else {
        rc = 0;
        if (strcmp(cmd, "retry") == 0 || strcmp(cmd, "cancel") == 0) {
            print_task_action(cmd, o);
        } else if (strcmp(cmd, "requeue-failed") == 0) {
            printf("requeue of FAILED%s%s tasks accepted as request %lld; 'taskpushctl stats' shows its result\n",
                   type ? " " : "", type ? type : "", num(o, "request_id"));
        } else if (strcmp(cmd, "drain") == 0) {
            printf("draining: no more claims, buffered tasks released, %lld in flight finishing; "
                   "'taskpushctl resume' ends it\n",
                   num(o, "in_flight"));
        } else {
            printf("%s%s%s: done\n", cmd, type ? " " : "", type ? type : "");
        }
    }
    json_decref(o);
    free(r.body);
    return rc;
}

/* ---- task-level commands: show, failed, retry, cancel ---- */

static bool task_command(const char *cmd)
{
    return strcmp(cmd, "show") == 0 || strcmp(cmd, "failed") == 0 || strcmp(cmd, "retry") == 0 ||
           strcmp(cmd, "cancel") == 0;
}

/* A time in ms since the epoch as "YYYY-MM-DD HH:MM:SS.mmm UTC" (or "-" for none). */
static const char *fmt_time(json_t *ms, char *buf, size_t cap)
{
    long long v = (long long)json_integer_value(ms);
    struct tm tm;
    time_t sec = (time_t)(v / 1000);
    if (!json_is_integer(ms) || v <= 0 || !gmtime_r(&sec, &tm)) {
        snprintf(buf, cap, "-");
        return buf;
    }
    size_t n = strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03lld UTC", v % 1000);
    return buf;
}

/* GET /schedules: each periodic task with its rule and next run. */
static void print_schedules(json_t *o)
{
    json_t *list = json_object_get(o, "schedules"), *sc;
    size_t i;
    printf("%-28s %-20s %-18s %-14s %-28s %s\n", "NAME", "TYPE", "EVERY", "MISSED", "NEXT RUN", "IN");
    json_array_foreach(list, i, sc) {
        char every[64], missed[32], when[64], in[32];
        json_t *iv = json_object_get(sc, "interval_ms"), *nin = json_object_get(sc, "next_run_in_ms");
        if (json_is_integer(iv))
            snprintf(every, sizeof every, "%lld ms", (long long)json_integer_value(iv));
        else
        {
            const char *cr = json_string_value(json_object_get(sc, "cron"));
            snprintf(every, sizeof every, "%s", cr ? cr : "?");
        }
        const char *m = json_string_value(json_object_get(sc, "missed"));
        if (m && strcmp(m, "catch-up") == 0)
            snprintf(missed, sizeof missed, "catch-up %lld", num(sc, "catch_up_max"));
        else
            snprintf(missed, sizeof missed, "%s", m ? m : "?");
        if (json_is_integer(nin))
            snprintf(in, sizeof in, "%.1f s", (double)json_integer_value(nin) / 1000.0);
        else
            snprintf(in, sizeof in, "-");
        const char *name = json_string_value(json_object_get(sc, "name")),
                   *type = json_string_value(json_object_get(sc, "type"));
        printf("%-28s %-20s %-18s %-14s %-28s %s\n", name ? name : "?", type ? type : "?", every, missed,
               fmt_time(json_object_get(sc, "next_run"), when, sizeof when), in);
    }
    if (json_array_size(list) == 0)
        printf("(no schedule in task_schedule)\n");
    if (json_is_true(json_object_get(o, "cut")))
        printf("(more schedules than listed)\n");
}

/* A string of the answer, "?" when absent (the answer is the dispatcher's, not ours). */
static const char *text(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

static const char *priority_name(long long p)
{
    return p == 0 ? "LOW" : p == 1 ? "NORMAL" : p == 2 ? "HIGH" : "?";
}

/* Up to 20 ids of a JSON array, "a, b, c" ("-" for none). */
static void print_ids(const char *label, json_t *a)
{
    size_t i, n = json_array_size(a);
    printf("%s", label);
    if (n == 0)
        printf("-");
    for (i = 0; i < n && i < 20; i++)
        printf("%s%lld", i ? ", " : "", (long long)json_integer_value(json_array_get(a, i)));
    printf("\n");
}

/* The "dependencies" of a task's answer, when it has them. */
static void print_deps(json_t *d)
{
    if (!json_is_object(d))
        return;
    printf("waits on    %lld task(s)%s, %lld pending%s\n", num(d, "total"),
           json_is_true(json_object_get(d, "total_capped")) ? " or more" : "", num(d, "pending"),
           json_is_true(json_object_get(d, "waiting")) ? "" : " (not waiting)");
    if (json_array_size(json_object_get(d, "pending_ids")) > 0)
        print_ids("pending on  ", json_object_get(d, "pending_ids"));
    if (json_array_size(json_object_get(d, "failed")) > 0)
        print_ids("failed deps ", json_object_get(d, "failed"));
    if (json_array_size(json_object_get(d, "missing")) > 0)
        print_ids("missing     ", json_object_get(d, "missing"));
}

static void print_task(json_t *o)
{
    char t1[64];
    const char *err = json_string_value(json_object_get(o, "err_msg"));
    json_t *held = json_object_get(o, "dispatcher");
    printf("task        %lld\n", num(o, "task_id"));
    printf("type        %s\n", text(o, "type"));
    printf("state       %s\n", text(o, "state"));
    printf("priority    %s\n", priority_name(num(o, "priority")));
    printf("attempts    %lld of %lld\n", num(o, "attempts"), num(o, "max_attempts"));
    printf("inserted    %s\n", fmt_time(json_object_get(o, "insert_time_ms"), t1, sizeof t1));
    printf("updated     %s\n", fmt_time(json_object_get(o, "last_update_time_ms"), t1, sizeof t1));
    printf("run after   %s\n", fmt_time(json_object_get(o, "run_after_ms"), t1, sizeof t1));
    if (json_is_integer(json_object_get(o, "timeout_ms")))
        printf("timeout     %lld ms\n", num(o, "timeout_ms"));
    else
        printf("timeout     the dispatcher's default\n");
    printf("err_msg     %s\n", err ? err : "-");
    printf("result      %lld bytes\n", num(o, "result_bytes"));
    json_t *pr = json_object_get(o, "progress");
    if (json_is_object(pr)) {
        const char *pm = json_string_value(json_object_get(pr, "message"));
        long long v = num(pr, "permille");
        printf("progress    %lld.%lld%%%s%s%s at %s\n", v / 10, v % 10, pm && *pm ? " (" : "",
               pm && *pm ? pm : "", pm && *pm ? ")" : "", fmt_time(json_object_get(pr, "at_ms"), t1, sizeof t1));
    }
    print_deps(json_object_get(o, "dependencies"));
    const char *hs = json_string_value(json_object_get(held, "state"));
    if (hs && strcmp(hs, "running") == 0)
        printf("held        running on worker %s (%s) since %s, attempt %lld\n",
               text(held, "worker"),
               text(held, "addr"),
               fmt_time(json_object_get(held, "since_ms"), t1, sizeof t1), num(held, "attempt"));
    else if (hs)
        printf("held        buffered in the dispatcher, not yet on a worker\n");
    else
        printf("held        not held by this dispatcher\n");
}

static void print_failed(json_t *list)
{
    size_t i;
    json_t *r;
    char t1[64];
    if (json_array_size(list) == 0) {
        printf("(no FAILED task)\n");
        return;
    }
    printf("%-12s %-20s %8s  %-27s  %s\n", "TASK", "TYPE", "ATTEMPTS", "FAILED AT", "ERROR");
    json_array_foreach(list, i, r) {
        const char *err = json_string_value(json_object_get(r, "err_msg"));
        char att[32];
        snprintf(att, sizeof att, "%lld/%lld", num(r, "attempts"), num(r, "max_attempts"));
        /* failed_at_ms since schema version 7; a dispatcher of before sends the same time
         * as last_update_time_ms only. */
        json_t *at = json_object_get(r, "failed_at_ms");
        printf("%-12lld %-20s %8s  %-27s  %.*s\n", num(r, "task_id"), text(r, "type"),
               att, fmt_time(at ? at : json_object_get(r, "last_update_time_ms"), t1, sizeof t1),
               err ? (int)strcspn(err, "\r\n") : 1, err ? err : "-");
    }
}

static void print_task_action(const char *cmd, json_t *o)
{
    const char *was = json_string_value(json_object_get(o, "cancelled"));
    const char *worker = json_string_value(json_object_get(o, "worker"));
    if (strcmp(cmd, "retry") == 0)
        printf("task %lld: back to NEW, attempts 0\n", num(o, "task_id"));
    else if (was && strcmp(was, "running") == 0)
        printf("task %lld: cancelled; its worker %s was told to stop; FAILED \"cancelled\"\n",
               num(o, "task_id"), worker ? worker : "?");
    else
        printf("task %lld: cancelled (%s); FAILED \"cancelled\"\n", num(o, "task_id"),
               was && strcmp(was, "buffered") == 0 ? "was buffered in the dispatcher"
               : was && strcmp(was, "unheld") == 0 ? "was PROCESSING, held by no dispatcher"
                                                    : "was NEW");
}

/* GET path and print the answer with print (or as it is with --json). */
static int run_task_get(const ctl_target *t, const char *path, bool as_json, void (*print)(json_t *))
{
    ctl_reply r = http_request(t, EVHTTP_REQ_GET, path, NULL);
    int rc = 1;
    json_t *o = r.status == 200 && r.body ? json_loads(r.body, 0, NULL) : NULL;
    if (r.status < 0) {
        no_answer(t, &r);
    } else if (r.status != 200 || !o) {
        if (r.body && *r.body && !o)
            fprintf(stderr, "taskpushctl: %.*s\n", (int)strcspn(r.body, "\r\n"), r.body);
        else
            fprintf(stderr, "taskpushctl: %s answered %d\n", t->admin, r.status);
    } else {
        if (as_json)
            printf("%s", r.body);
        else
            print(o);
        rc = 0;
    }
    json_decref(o);
    free(r.body);
    return rc;
}

/* Fills t from --admin, --tls and --tls-ca (an https:// address implies --tls).
 * Returns 0, or -1 after saying what is wrong (the caller exits 2). */
static int target_open(ctl_target *t, const char *admin, bool tls, const char *tls_ca)
{
    char why[160];
    if (parse_admin(admin, t, &tls, why, sizeof why) < 0) {
        fprintf(stderr, "taskpushctl: --admin '%s': %s\nTry 'taskpushctl --help'.\n", admin, why);
        return -1;
    }
    if (tls_ca && !tls) {
        fprintf(stderr, "taskpushctl: --tls-ca goes with --tls or an https:// --admin\n");
        return -1;
    }
    char err[512];
    if (tls && !(t->tls = dsp_tls_client_ctx_new(tls_ca, err, sizeof err))) {
        fprintf(stderr, "taskpushctl: %s\n", err);
        return -1;
    }
    return 0;
}

/* The task-level commands, from their arguments (args[0] the command) to the exit status. */
static int task_main(int nargs, char **args, const char *admin, bool tls, const char *tls_ca,
                     const char *type, const char *limit, bool force, const char *admin_token_file,
                     const char *token_file, bool as_json)
{
    const char *cmd = args[0];
    bool failed = strcmp(cmd, "failed") == 0;
    if (nargs != (failed ? 1 : 2)) {
        fprintf(stderr, "taskpushctl: usage: %s\nTry 'taskpushctl --help'.\n",
                failed ? "failed [--type T] [--limit N]" : strcmp(cmd, "show") == 0 ? "show ID"
                : strcmp(cmd, "retry") == 0 ? "retry ID" : "cancel ID");
        return 2;
    }
    const char *id = failed ? NULL : args[1];
    if (id && (strspn(id, "0123456789") != strlen(id) || strlen(id) > 20 || strspn(id, "0") == strlen(id))) {
        fprintf(stderr, "taskpushctl: '%s' is not a task id (1 to 18446744073709551615)\n", id);
        return 2;
    }
    char *end = NULL;
    long long lim = limit ? strtoll(limit, &end, 10) : 20;
    if (limit && (end == limit || *end || lim < 1 || lim > 1000 || !failed)) {
        fprintf(stderr, "taskpushctl: %s\n", failed ? "--limit must be 1 to 1000" : "--limit goes with failed only");
        return 2;
    }
    if ((type && !failed) || force) {
        fprintf(stderr, "taskpushctl: %s\n", force ? "--force goes with pause and resume only"
                                                   : "--type goes with failed (and pause, resume, requeue-failed)");
        return 2;
    }
    if (type && (!*type || strlen(type) > 256)) {
        fprintf(stderr, "taskpushctl: --type must be 1 to 256 bytes\n");
        return 2;
    }
    ctl_target target = {.admin = admin};
    if (target_open(&target, admin, tls, tls_ca) < 0)
        return 2;
    char path[1024];
    int rc;
    if (failed) {
        char *enc = type ? evhttp_encode_uri(type) : NULL;
        snprintf(path, sizeof path, "/failed?limit=%lld%s%s", lim, enc ? "&type=" : "", enc ? enc : "");
        free(enc);
        rc = run_task_get(&target, path, as_json, print_failed);
    } else if (strcmp(cmd, "show") == 0) {
        snprintf(path, sizeof path, "/task?id=%s", id);
        rc = run_task_get(&target, path, as_json, print_task);
    } else {
        snprintf(path, sizeof path, "/%s?id=%s", cmd, id);
        rc = run_post(&target, cmd, path, NULL, admin_token_file, token_file, as_json, false);
    }
    dsp_tls_ctx_free(target.tls);
    return rc;
}

int main(int argc, char **argv)
{
    const char *admin = getenv("TASKPUSH_ADMIN") ? getenv("TASKPUSH_ADMIN") : "127.0.0.1:7071";
    bool as_json = false, tls = false;
    const char *type = NULL, *token_file = NULL, *admin_token_file = NULL, *tls_ca = NULL;
    const char *limit = NULL; /* failed --limit */
    bool force = false;       /* pause/resume --force */
    static const struct option longopts[] = {
        {"admin", required_argument, NULL, 'a'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},        {"version", no_argument, NULL, 'V'},
        {"type", required_argument, NULL, 't'},  {"token-file", required_argument, NULL, 'k'},
        {"tls", no_argument, NULL, 's'},         {"tls-ca", required_argument, NULL, 'C'},
        {"admin-token-file", required_argument, NULL, 'K'},
        {"limit", required_argument, NULL, 'L'}, {"force", no_argument, NULL, 'F'},
        {NULL, 0, NULL, 0},
    };
    /* submit has options of its own (ctl_submit.c): the command decides. A value such
     * as `--type submit` is not the command. */
    static const char *const valued[] = {"--admin", "--type", "--token-file", "--tls-ca",
                                         "--admin-token-file", "--limit", "--worker",
                                         "--priority", "--dedup-key", "--group-key", "--after", "--delay-ms",
                                         "--max-attempts", "--timeout-ms", "--wait-ms"};
    for (int i = 1; i < argc; i++) {
        bool is_value = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            is_value |= strcmp(argv[i - 1], valued[k]) == 0;
        if (!is_value && strcmp(argv[i], "submit") == 0)
            return ctl_submit_main(argc, argv);
    }
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'a':
            admin = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 't':
            type = optarg;
            break;
        case 'k':
            token_file = optarg;
            break;
        case 's':
            tls = true;
            break;
        case 'C':
            tls_ca = optarg;
            break;
        case 'K':
            admin_token_file = optarg;
            break;
        case 'L':
            limit = optarg;
            break;
        case 'F':
            force = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("taskpushctl %s\n", TASKPUSH_VERSION);
            return 0;
        case ':':
            fprintf(stderr, "taskpushctl: option '%s' needs a value\nTry 'taskpushctl --help'.\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "taskpushctl: unknown option '%s'\nTry 'taskpushctl --help'.\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc && task_command(argv[optind]))
        return task_main(argc - optind, argv + optind, admin, tls, tls_ca, type, limit, force,
                         admin_token_file, token_file, as_json);
    if (limit) {
        fprintf(stderr, "taskpushctl: --limit goes with failed only\n");
        return 2;
    }
    if (force && (!type || (strcmp(argv[argc - 1], "pause") != 0 && strcmp(argv[argc - 1], "resume") != 0))) {
        fprintf(stderr, "taskpushctl: --force goes with pause --type T and resume --type T only\n");
        return 2;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "taskpushctl: %s\nTry 'taskpushctl --help'.\n",
                optind == argc ? "a command is required" : "one command at a time");
        return 2;
    }
    const char *cmd = argv[optind];
    const char *path = strcmp(cmd, "stats") == 0     ? "/stats"
                       : strcmp(cmd, "workers") == 0 ? "/workers"
                       : strcmp(cmd, "health") == 0  ? "/healthz"
                       : strcmp(cmd, "schedules") == 0 ? "/schedules"
                                                     : NULL;
    const char *post = strcmp(cmd, "pause") == 0            ? "/pause"
                       : strcmp(cmd, "resume") == 0         ? "/resume"
                       : strcmp(cmd, "drain") == 0          ? "/drain"
                       : strcmp(cmd, "requeue-failed") == 0 ? "/requeue-failed"
                                                            : NULL;
    if (!path && !post) {
        fprintf(stderr, "taskpushctl: unknown command '%s'\nTry 'taskpushctl --help'.\n", cmd);
        return 2;
    }
    if (type && (!post || strcmp(cmd, "drain") == 0)) {
        fprintf(stderr, "taskpushctl: --type goes with pause, resume and requeue-failed only\n");
        return 2;
    }
    if (type && (!*type || strlen(type) > 256)) {
        fprintf(stderr, "taskpushctl: --type must be 1 to 256 bytes\n");
        return 2;
    }
    ctl_target target = {.admin = admin};
    if (target_open(&target, admin, tls, tls_ca) < 0)
        return 2;
    if (post) {
        int prc = run_post(&target, cmd, post, type, admin_token_file, token_file, as_json, force);
        dsp_tls_ctx_free(target.tls);
        return prc;
    }
    ctl_reply r = http_request(&target, EVHTTP_REQ_GET, path, NULL);
    dsp_tls_ctx_free(target.tls);
    int rc = 1;
    if (r.status < 0) {
        no_answer(&target, &r);
    } else if (strcmp(cmd, "health") == 0) {
        bool ok = r.status == 200;
        if (as_json)
            printf("{\"healthy\":%s,\"status\":%d}\n", ok ? "true" : "false", r.status);
        else
            printf("%s", r.body ? r.body : "");
        rc = ok ? 0 : 1;
    } else if (r.status != 200) {
        fprintf(stderr, "taskpushctl: %s answered %d\n", admin, r.status);
    } else if (as_json) {
        printf("%s", r.body);
        rc = 0;
    } else {
        json_t *o = json_loads(r.body, 0, NULL);
        if (!o) {
            fprintf(stderr, "taskpushctl: %s did not answer JSON\n", admin);
        } else {
            if (strcmp(cmd, "stats") == 0)
                print_stats(o);
            else if (strcmp(cmd, "schedules") == 0)
                print_schedules(o);
            else
                print_workers(o);
            json_decref(o);
            rc = 0;
        }
    }
    free(r.body);
    return rc;
}
