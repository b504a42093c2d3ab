#include "daemon.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *tp_build_path(const char *relative)
{
    static char path[1024];
    const char *root = getenv("TASKPUSH_BUILD_ROOT");
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", relative);
    return path;
}

int tp_daemon_start(tp_daemon *d, const char *db_url, const char *const *extra_args)
{
    static int serial;
    memset(d, 0, sizeof *d);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(d->ready_path, sizeof d->ready_path, "%s/taskpushd-%d-%d.ready", tmp, (int)getpid(), serial);
    snprintf(d->log_path, sizeof d->log_path, "%s/taskpushd-%d-%d.log", tmp, (int)getpid(), serial++);
    unlink(d->ready_path);

    const char *argv[64];
    int argc = 0;
    argv[argc++] = tp_build_path("dispatcher/taskpushd");
    argv[argc++] = "--db";
    argv[argc++] = db_url;
    argv[argc++] = "--listen";
    argv[argc++] = "127.0.0.1:0";
    argv[argc++] = "--admin";
    argv[argc++] = "127.0.0.1:0";
    argv[argc++] = "--ready-file";
    argv[argc++] = d->ready_path;
    /* TASKPUSH_TEST_SQL_DIALECT=mysql runs every test's daemon in MySQL's dialect on the
     * tests' MariaDB; a test's own --sql-dialect comes later and wins. */
    const char *dialect = getenv("TASKPUSH_TEST_SQL_DIALECT");
    if (dialect && *dialect) {
        argv[argc++] = "--sql-dialect";
        argv[argc++] = dialect;
    }
    for (int i = 0; extra_args && extra_args[i] && argc < 62; i++)
        argv[argc++] = extra_args[i];
    argv[argc] = NULL;

    char *const *cargv = (char *const *)argv;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(d->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], cargv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    d->pid = pid;
    for (long long end = tp_mono_ms() + 15000; tp_mono_ms() < end; tp_sleep_ms(20)) {
        json_error_t err;
        json_t *o = json_load_file(d->ready_path, 0, &err);
        if (o) {
            const char *l = json_string_value(json_object_get(o, "listen"));
            const char *a = json_string_value(json_object_get(o, "admin"));
            if (l && a) {
                snprintf(d->listen, sizeof d->listen, "%s", l);
                snprintf(d->admin, sizeof d->admin, "%s", a);
            }
            json_decref(o);
            if (d->listen[0])
                return 0;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            fprintf(stderr, "taskpushd exited early (status %d)\n", status);
            tp_daemon_dump_log(d);
            d->pid = 0;
            return -1;
        }
    }
    fprintf(stderr, "taskpushd wrote no ready file within 15 s\n");
    tp_daemon_dump_log(d);
    tp_daemon_stop(d, SIGKILL, 1000);
    return -1;
}

int tp_daemon_wait_leader(tp_daemon *d, int timeout_ms)
{
    for (long long end = tp_mono_ms() + timeout_ms; tp_mono_ms() < end; tp_sleep_ms(20)) {
        json_t *s = tp_daemon_json(d, "/stats");
        bool leader = json_is_true(json_object_get(s, "leader"));
        json_decref(s);
        if (leader)
            return 0;
    }
    return -1;
}

int tp_daemon_stop(tp_daemon *d, int sig, int timeout_ms)
{
    if (d->pid <= 0)
        return -1;
    if (sig)
        kill(d->pid, sig);
    int status = 0;
    long long end = tp_mono_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid)
            break;
        if (r < 0)
            return -1;
        if (tp_mono_ms() >= end) {
            fprintf(stderr, "taskpushd did not stop within %d ms; killing it\n", timeout_ms);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            break;
        }
        tp_sleep_ms(10);
    }
    d->pid = 0;
    unlink(d->ready_path);
    d->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return d->exit_status;
}

void tp_daemon_dump_log(const tp_daemon *d)
{
    FILE *f = fopen(d->log_path, "r");
    if (!f)
        return;
    char line[2048];
    fprintf(stderr, "---- %s ----\n", d->log_path);
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fclose(f);
}

int tp_daemon_log_count(const tp_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log_path, "r");
    if (!f)
        return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

struct http_result {
    int status;
    char *body;
    struct event_base *base;
};

static void http_done(struct evhttp_request *req, void *arg)
{
    struct http_result *r = arg;
    if (req && evhttp_request_get_response_code(req) > 0) {
        r->status = evhttp_request_get_response_code(req);
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        size_t n = evbuffer_get_length(in);
        r->body = malloc(n + 1);
        if (r->body) {
            evbuffer_remove(in, r->body, n);
            r->body[n] = '\0';
        }
    }
    /* The kept-alive connection would hold the loop until its timeout. */
    event_base_loopexit(r->base, NULL);
}

int tp_http_request(const char *hostport, const char *method, const char *path, char **body)
{
    char host[128];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host)
        return -1;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    int port = atoi(colon + 1);

    struct event_base *base = event_base_new();
    struct http_result r = {-1, NULL, base};
    struct evhttp_connection *conn = evhttp_connection_base_new(base, NULL, host, (unsigned short)port);
    evhttp_connection_set_timeout(conn, 5);
    struct evhttp_request *req = evhttp_request_new(http_done, &r);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
    enum evhttp_cmd_type cmd = strcmp(method, "POST") == 0 ? EVHTTP_REQ_POST
                               : strcmp(method, "PUT") == 0 ? EVHTTP_REQ_PUT
                               : strcmp(method, "DELETE") == 0 ? EVHTTP_REQ_DELETE
                                                                : EVHTTP_REQ_GET;
    if (cmd == EVHTTP_REQ_POST) /* as taskpushctl: taskpushd refuses a "simple" POST */
        evhttp_add_header(evhttp_request_get_output_headers(req), "X-Taskpush-Admin", "1");
    if (evhttp_make_request(conn, req, cmd, path) == 0)
        event_base_dispatch(base);
    evhttp_connection_free(conn);
    event_base_free(base);
    if (body)
        *body = r.body;
    else
        free(r.body);
    return r.status;
}

json_t *tp_daemon_json(const tp_daemon *d, const char *path)
{
    char *body = NULL;
    if (tp_http_request(d->admin, "GET", path, &body) != 200) {
        free(body);
        return NULL;
    }
    json_t *o = json_loads(body, 0, NULL);
    free(body);
    return o;
}

long long tp_json_int_at(json_t *root, const char *dotted)
{
    json_t *cur = root;
    char key[128];
    for (const char *p = dotted; cur && *p;) {
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

long long tp_daemon_stat(const tp_daemon *d, const char *dotted)
{
    json_t *root = tp_daemon_json(d, "/stats");
    long long v = tp_json_int_at(root, dotted);
    json_decref(root);
    return v;
}

bool tp_daemon_wait_stat(const tp_daemon *d, const char *dotted, long long want, bool at_least,
                         int timeout_ms)
{
    long long end = tp_mono_ms() + timeout_ms;
    for (;;) {
        long long v = tp_daemon_stat(d, dotted);
        if (at_least ? v >= want : v == want)
            return true;
        if (tp_mono_ms() > end) {
            fprintf(stderr, "/stats %s is %lld after %d ms, want %s%lld\n", dotted, v, timeout_ms,
                    at_least ? "at least " : "", want);
            return false;
        }
        tp_sleep_ms(20);
    }
}
