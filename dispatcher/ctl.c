/* taskpushctl: the operator's view of a running taskpushd, over its admin port.
 *
 *   taskpushctl [--admin HOST:PORT] [--json] stats|workers|health
 *
 * Exit status: 0 when the dispatcher answered (for health: answered healthy),
 * 1 when it is unhealthy or did not answer, 2 for a bad command line. */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ctl_reply {
    int status; /* HTTP status, -1 when no answer */
    char *body;
} ctl_reply;

static void reply_cb(struct evhttp_request *req, void *arg)
{
    ctl_reply *r = arg;
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

static ctl_reply http_get(const char *admin, const char *path)
{
    ctl_reply r = {-1, NULL};
    char host[256];
    const char *colon = strrchr(admin, ':');
    if (!colon || colon == admin || (size_t)(colon - admin) >= sizeof host)
        return r;
    memcpy(host, admin, (size_t)(colon - admin));
    host[colon - admin] = '\0';
    struct event_base *base = event_base_new();
    struct evhttp_connection *conn =
        base ? evhttp_connection_base_new(base, NULL, host, (unsigned short)atoi(colon + 1)) : NULL;
    struct evhttp_request *req = conn ? evhttp_request_new(reply_cb, &r) : NULL;
    if (req) {
        evhttp_connection_set_timeout(conn, 5);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
        if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, path) == 0)
            event_base_dispatch(base);
    }
    if (conn)
        evhttp_connection_free(conn);
    if (base)
        event_base_free(base);
    return r;
}

static long long num(json_t *o, const char *key)
{
    return (long long)json_integer_value(json_object_get(o, key));
}

static void print_stats(json_t *s)
{
    json_t *t = json_object_get(s, "tasks"), *q = json_object_get(s, "queue");
    printf("database    %s%s\n", json_is_true(json_object_get(s, "db_connected")) ? "reachable" : "UNREACHABLE",
           json_is_true(json_object_get(s, "leader")) ? ", leading the table" : ", waiting for the table");
    printf("uptime      %lld s\n", num(s, "uptime_s"));
    printf("scheduler   %s\n", json_string_value(json_object_get(s, "scheduler")));
    printf("workers     %lld\n", num(s, "workers"));
    printf("queue       %lld buffered, %lld in flight\n", num(q, "buffered"), num(q, "in_flight"));
    printf("tasks       %lld claimed, %lld dispatched, %lld succeeded, %lld failed,\n"
           "            %lld retried, %lld requeued\n",
           num(t, "claimed_total"), num(t, "dispatched_total"), num(t, "succeeded_total"),
           num(t, "failed_total"), num(t, "retried_total"), num(t, "requeued_total"));
}

static void print_workers(json_t *list)
{
    printf("%-24s %-22s %8s %9s %10s %8s  %s\n", "NAME", "ADDRESS", "CAPACITY", "IN FLIGHT",
           "COMPLETED", "UP (s)", "TYPES");
    size_t i;
    json_t *w;
    json_array_foreach(list, i, w) {
        char types[256] = "";
        size_t k, used = 0;
        json_t *ty;
        json_array_foreach(json_object_get(w, "types"), k, ty) {
            int n = snprintf(types + used, sizeof types - used, "%s%s", k ? "," : "", json_string_value(ty));
            if (n < 0 || (size_t)n >= sizeof types - used)
                break;
            used += (size_t)n;
        }
        printf("%-24s %-22s %8lld %9lld %10lld %8lld  %s\n", json_string_value(json_object_get(w, "name")),
               json_string_value(json_object_get(w, "addr")), num(w, "capacity"), num(w, "in_flight"),
               num(w, "completed_total"), num(w, "connected_s"), types);
    }
    if (json_array_size(list) == 0)
        printf("(no worker connected)\n");
}

static void usage(FILE *out)
{
    fprintf(out, "Usage: taskpushctl [--admin HOST:PORT] [--json] COMMAND\n"
                 "Shows a running taskpushd through its admin port.\n\n"
                 "Commands:\n"
                 "  stats     counters, queue and database state\n"
                 "  workers   connected workers and their load\n"
                 "  health    'ok' and exit 0 while the database is reachable, else exit 1\n\n"
                 "Options:\n"
                 "  --admin HOST:PORT   the admin port (default 127.0.0.1:7071, or TASKPUSH_ADMIN)\n"
                 "  --json              print the dispatcher's JSON as it is (for scripts)\n"
                 "  -h, --help          show this help\n"
                 "  --version           show the version\n");
}

int main(int argc, char **argv)
{
    const char *admin = getenv("TASKPUSH_ADMIN") ? getenv("TASKPUSH_ADMIN") : "127.0.0.1:7071";
    bool as_json = false;
    static const struct option longopts[] = {
        {"admin", required_argument, NULL, 'a'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'a':
            admin = optarg;
            break;
        case 'j':
            as_json = true;
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
    if (optind != argc - 1) {
        fprintf(stderr, "taskpushctl: %s\nTry 'taskpushctl --help'.\n",
                optind == argc ? "a command is required" : "one command at a time");
        return 2;
    }
    const char *cmd = argv[optind];
    const char *path = strcmp(cmd, "stats") == 0     ? "/stats"
                       : strcmp(cmd, "workers") == 0 ? "/workers"
                       : strcmp(cmd, "health") == 0  ? "/healthz"
                                                     : NULL;
    if (!path) {
        fprintf(stderr, "taskpushctl: unknown command '%s'\nTry 'taskpushctl --help'.\n", cmd);
        return 2;
    }
    ctl_reply r = http_get(admin, path);
    int rc = 1;
    if (r.status < 0) {
        fprintf(stderr, "taskpushctl: no answer from %s\n", admin);
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
            else
                print_workers(o);
            json_decref(o);
            rc = 0;
        }
    }
    free(r.body);
    return rc;
}
