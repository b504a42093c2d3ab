/* test_tls: TLS on both ports of the real taskpushd (docs/taskpushd.md, TLS).
 *
 * Real components only: MariaDB (scripts/tp-mariadb, see testdb.h), the taskpushd,
 * taskpush-worker and taskpushctl of the build tree, libtaskpush workers in threads,
 * and certificates made for this run by the `openssl` command: a CA, a server
 * certificate for 127.0.0.1 (an IP subjectAltName), a client certificate signed by the
 * CA, and an unrelated second CA with a client certificate of its own. Waits are
 * bounded polls; nothing asserts on how long something took.
 *
 * Cases:
 *   tls_worker_completes   a TLS worker trusting the CA completes every task; a worker
 *                          with a wrong token is refused; no token reaches the log
 *   wrong_ca_or_name       a worker trusting another CA, and one connecting by a name the
 *                          certificate does not carry, never get past the handshake and
 *                          receive no task, while a good worker is served meanwhile
 *   plaintext_refused      a plaintext HELLO on the TLS worker port gets no frame back and
 *                          its connection closed; a plaintext libtaskpush worker never
 *                          connects; a TLS worker completes tasks afterwards
 *   client_cert_required   with --tls-ca: no client certificate, or one of another CA, is
 *                          refused; the CA's client certificate works, in libtaskpush and
 *                          in taskpush-worker
 *   admin_over_tls         taskpushctl over https:// (and --tls) prints stats and health,
 *                          asks no client certificate; the wrong CA fails; a plaintext GET
 *                          gets no HTTP answer and the daemon keeps answering
 *   bad_flags              --tls-cert without --tls-key and the other bad combinations or
 *                          files: exit 2 with a message, in all three programs
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "proto.h"
#include "raw.h"
#include "rows.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 60000
#define POLL_MS 20
#define MAX_WK 6
#define REFUSED_ATTEMPTS 3 /* connects a refused worker makes before we judge it */

/* ---- certificates ---- */

struct certs {
    char dir[256];
    char ca[300], server[300], server_key[300], client[300], client_key[300];
    char other_ca[300], other_client[300], other_client_key[300];
};

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Runs a shell command line; returns its exit status (-1 when it did not exit). */
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Makes the CAs and certificates with the openssl command into a fresh directory.
 * Returns 0, or -1 with the failing step on stderr (openssl missing included). */
static int certs_make(struct certs *c)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(c->dir, sizeof c->dir, "%s/test_tls_%d_XXXXXX", tmp, (int)getpid());
    if (!mkdtemp(c->dir)) {
        perror("mkdtemp");
        return -1;
    }
#define P(field, name) snprintf(c->field, sizeof c->field, "%s/%s", c->dir, name)
    P(ca, "ca.pem");
    P(server, "server.pem");
    P(server_key, "server.key");
    P(client, "client.pem");
    P(client_key, "client.key");
    P(other_ca, "other-ca.pem");
    P(other_client, "other-client.pem");
    P(other_client_key, "other-client.key");
#undef P
    /* EC keys: quick to make, even under ASan. */
    static const char *const key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    static const char *const ca_ext = "-addext basicConstraints=critical,CA:TRUE "
                                      "-addext keyUsage=critical,keyCertSign,cRLSign";
    const char *const steps[] = {
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext",
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext",
        "openssl req -x509 %1$s -keyout ca.key -out ca.pem -days 2 -subj /CN=taskpush-test-ca %2$s",
        "openssl req -x509 %1$s -keyout other-ca.key -out other-ca.pem -days 2 "
        "-subj /CN=taskpush-other-ca %2$s",
        "openssl req %1$s -keyout server.key -out server.csr -subj /CN=taskpushd-test",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile server.ext -out server.pem",
        "openssl req %1$s -keyout client.key -out client.csr -subj /CN=worker-1",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile client.ext -out client.pem",
        "openssl req %1$s -keyout other-client.key -out other-client.csr -subj /CN=worker-2",
        "openssl x509 -req -in other-client.csr -CA other-ca.pem -CAkey other-ca.key "
        "-CAcreateserial -days 2 -extfile client.ext -out other-client.pem",
        "openssl verify -CAfile ca.pem server.pem client.pem",
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        char line[1024];
        snprintf(line, sizeof line, steps[i], key, ca_ext);
        if (sh("cd '%s' && { %s; } >>openssl.log 2>&1", c->dir, line) != 0) {
            fprintf(stderr, "making test certificates failed at: %s (is openssl installed? "
                            "scripts/install-deps.sh)\n", line);
            sh("cat '%s/openssl.log' >&2", c->dir);
            return -1;
        }
    }
    return 0;
}

static void certs_remove(struct certs *c)
{
    if (c->dir[0] && sh("rm -rf '%s'", c->dir) != 0)
        fprintf(stderr, "could not remove %s\n", c->dir);
}

/* ---- workers in threads ---- */

struct wk {
    char name[64];
    tp_worker *w;
    tp_inproc run;
    atomic_uint_fast64_t done;
    pthread_mutex_t mu;
    char warned[512]; /* every warning the library logged, joined (cut at the end) */
};

struct fx {
    const struct certs *c;
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_daemon;
    struct wk wk[MAX_WK];
    int nwk;
    char token_path[300];
    bool passed;
};

static int on_task(tp_task *t, void *arg)
{
    (void)t;
    atomic_fetch_add(&((struct wk *)arg)->done, 1);
    return TP_SUCCESS;
}

static void on_log(void *arg, int level, const char *msg)
{
    struct wk *k = arg;
    if (level > TP_LOG_WARN)
        return;
    pthread_mutex_lock(&k->mu);
    size_t used = strlen(k->warned);
    snprintf(k->warned + used, sizeof k->warned - used, "%s|", msg);
    pthread_mutex_unlock(&k->mu);
}

static bool wk_warned(struct wk *k, const char *needle)
{
    pthread_mutex_lock(&k->mu);
    bool found = strstr(k->warned, needle) != NULL;
    pthread_mutex_unlock(&k->mu);
    return found;
}

struct wk_opts {
    const char *addresses; /* NULL: the daemon's worker port */
    int tls;
    const char *ca, *cert, *key, *token;
};

static struct wk *wk_start(struct fx *fx, const char *name, const char *type, struct wk_opts wo)
{
    assert_true(fx->nwk < MAX_WK);
    struct wk *k = &fx->wk[fx->nwk++];
    snprintf(k->name, sizeof k->name, "%s", name);
    pthread_mutex_init(&k->mu, NULL);
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = wo.addresses ? wo.addresses : fx->d.listen;
    o.name = k->name;
    o.capacity = 4;
    o.threads = 4;
    o.reconnect_min_ms = 50;
    o.reconnect_max_ms = 200;
    o.token = wo.token;
    o.log = on_log;
    o.log_arg = k;
    o.log_level = TP_LOG_WARN;
    o.tls = wo.tls;
    o.tls_ca_file = wo.ca;
    o.tls_cert_file = wo.cert;
    o.tls_key_file = wo.key;
    k->w = tp_worker_new(&o, &err);
    if (!k->w)
        fail_msg("tp_worker_new(%s): %s", name, err.text);
    assert_int_equal(tp_worker_add_type(k->w, type, on_task, k), 0);
    assert_int_equal(tp_inproc_start(&k->run, k->w), 0);
    return k;
}

static tp_worker_stats wk_stats(struct wk *k)
{
    tp_worker_stats s;
    assert_int_equal(tp_worker_get_stats(k->w, &s, sizeof s), 0);
    return s;
}

/* Waits until k has tried REFUSED_ATTEMPTS connects, then checks that none got
 * through the handshake and no task reached it. */
static void wk_expect_refused(struct wk *k)
{
    long long end = tp_mono_ms() + WAIT_MS;
    while (wk_stats(k).connect_attempts < REFUSED_ATTEMPTS) {
        if (tp_mono_ms() > end)
            fail_msg("worker %s made fewer than %d connects", k->name, REFUSED_ATTEMPTS);
        tp_sleep_ms(POLL_MS);
    }
    tp_worker_stats s = wk_stats(k);
    char warned[sizeof k->warned];
    pthread_mutex_lock(&k->mu);
    memcpy(warned, k->warned, sizeof warned);
    pthread_mutex_unlock(&k->mu);
    printf("# %s: %llu connects, %llu welcomed, %llu tasks; warned: %.200s\n", k->name,
           (unsigned long long)s.connect_attempts, (unsigned long long)s.connections,
           (unsigned long long)s.tasks_received, warned);
    assert_int_equal(s.connections, 0);
    assert_int_equal(s.tasks_received, 0);
    assert_int_equal(atomic_load(&k->done), 0);
}

/* ---- fixture ---- */

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    fx->c = *state; /* the certificates main() made */
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    for (int i = 0; i < fx->nwk; i++) {
        struct wk *k = &fx->wk[i];
        if (tp_inproc_halt(&k->run) != 0)
            fprintf(stderr, "tp_worker_run(%s) failed\n", k->name);
        tp_worker_free(k->w);
        pthread_mutex_destroy(&k->mu);
    }
    if (fx->have_daemon) {
        if (fx->d.pid > 0)
            tp_daemon_stop(&fx->d, SIGKILL, 5000);
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
        unlink(fx->d.log_path);
    }
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    if (fx->token_path[0])
        unlink(fx->token_path);
    free(fx);
    return 0;
}

/* Starts taskpushd with TLS (and the extra flags); with_ca adds --tls-ca. */
static void fx_daemon(struct fx *fx, const char *tag, bool with_ca, const char *const *extra)
{
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    const char *args[24];
    int n = 0;
    args[n++] = "--tls-cert";
    args[n++] = fx->c->server;
    args[n++] = "--tls-key";
    args[n++] = fx->c->server_key;
    if (with_ca) {
        args[n++] = "--tls-ca";
        args[n++] = fx->c->ca;
    }
    for (int i = 0; extra && extra[i] && n < 23; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_log_count(&fx->d, "(both TLS)"), 1);
}

static void insert_tasks(struct fx *fx, const char *type, int n)
{
    assert_true(tp_rows_insert(&fx->db, type, n, true) == 0);
}

/* Waits until want rows of type are SUCCESSFUL. */
static void wait_done(struct fx *fx, const char *type, uint64_t want)
{
    uint64_t n;
    if (!tp_rows_wait(&fx->db, type, 2, want, WAIT_MS, POLL_MS, &n))
        fail_msg("type %s: %llu rows SUCCESSFUL, want %llu", type, (unsigned long long)n,
                 (unsigned long long)want);
}

static void assert_daemon_alive(struct fx *fx)
{
    int status;
    assert_int_equal(waitpid(fx->d.pid, &status, WNOHANG), 0);
}

/* ---- cases ---- */

static void tls_worker_completes(void **state)
{
    struct fx *fx = *state;
    static const char secret[] = "tls-token-3f9a7c";
    snprintf(fx->token_path, sizeof fx->token_path, "%s/token", fx->c->dir);
    FILE *f = fopen(fx->token_path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", secret);
    fclose(f);
    const char *const extra[] = {"--token-file", fx->token_path, "--log-level", "debug", NULL};
    fx_daemon(fx, "tls_good", false, extra);

    struct wk *wrong = wk_start(fx, "wrong-token", "a",
                                (struct wk_opts){.tls = 1, .ca = fx->c->ca, .token = "guessed-token-77"});
    struct wk *good = wk_start(fx, "good", "a", (struct wk_opts){.tls = 1, .ca = fx->c->ca, .token = secret});
    insert_tasks(fx, "a", 500);
    wait_done(fx, "a", 500);
    assert_int_equal(atomic_load(&good->done), 500);
    tp_worker_stats s = wk_stats(good);
    assert_true(s.connections >= 1);
    assert_int_equal(s.tasks_completed, 500);

    /* The wrong token passes the handshake (TLS is fine) but HELLO is refused. */
    wk_expect_refused(wrong);
    assert_true(tp_daemon_log_count(&fx->d, "missing or wrong token") >= 1);
    /* Neither secret is ever logged, not even at debug level. */
    assert_int_equal(tp_daemon_log_count(&fx->d, secret), 0);
    assert_int_equal(tp_daemon_log_count(&fx->d, "guessed-token-77"), 0);
    fx->passed = true;
}

static void wrong_ca_or_name(void **state)
{
    struct fx *fx = *state;
    fx_daemon(fx, "tls_wrong_ca", false, NULL);
    struct wk *other = wk_start(fx, "trusts-other-ca", "a", (struct wk_opts){.tls = 1, .ca = fx->c->other_ca});
    char by_name[160];
    snprintf(by_name, sizeof by_name, "localhost:%s", strrchr(fx->d.listen, ':') + 1);
    struct wk *named = wk_start(fx, "by-name", "a",
                                (struct wk_opts){.addresses = by_name, .tls = 1, .ca = fx->c->ca});
    wk_expect_refused(other);
    assert_true(wk_warned(other, "certificate verify failed"));
    wk_expect_refused(named);
    assert_true(wk_warned(named, "hostname mismatch"));

    /* The daemon serves a good worker while the two keep trying. */
    struct wk *good = wk_start(fx, "good", "a", (struct wk_opts){.tls = 1, .ca = fx->c->ca});
    insert_tasks(fx, "a", 200);
    wait_done(fx, "a", 200);
    assert_int_equal(atomic_load(&good->done), 200);
    assert_int_equal(wk_stats(other).tasks_received, 0);
    assert_int_equal(wk_stats(named).tasks_received, 0);
    assert_int_equal(wk_stats(other).connections, 0);
    assert_int_equal(wk_stats(named).connections, 0);
    assert_true(tp_daemon_log_count(&fx->d, "closed before HELLO: TLS") >= 1);
    assert_daemon_alive(fx);
    fx->passed = true;
}

/* Connects to hostport over plain TCP, sends a real HELLO (nothing when
 * silent), and reads until the daemon closes (at most 10 s: a timeout fails).
 * Returns the bytes received. */
static size_t plaintext_hello(const char *hostport, bool silent, uint8_t *got, size_t cap)
{
    int fd = tp_raw_connect(hostport, 10);
    assert_true(fd >= 0);

    if (!silent)
        assert_int_equal(tp_raw_hello(fd, "plain", 5, "a"), 0);
    size_t len = 0;
    for (;;) {
        ssize_t r = recv(fd, got + len, cap - len, 0);
        if (r > 0 && len + (size_t)r < cap) {
            len += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            fail_msg("the daemon kept a plaintext connection open for 10 s");
        break; /* closed (0), reset (ECONNRESET), or more than cap bytes (asserted below) */
    }
    assert_true(len < cap);
    close(fd);
    return len;
}

static void plaintext_refused(void **state)
{
    struct fx *fx = *state;
    /* Short heartbeats: a silent connection is closed after 3 of them. */
    const char *const extra[] = {"--heartbeat-ms", "200", NULL};
    fx_daemon(fx, "tls_plain", false, extra);
    uint8_t got[4096];
    size_t n = plaintext_hello(fx->d.listen, false, got, sizeof got);
    printf("# plaintext HELLO: %zu bytes back, first 0x%02x\n", n, n ? got[0] : 0);
    /* Nothing of the task protocol comes back (a frame would start with its
     * length's high byte, 0): at most a TLS alert record (type 0x15). */
    assert_true(n == 0 || got[0] == 0x15);
    /* A peer that never starts the handshake is closed too (the HELLO deadline). */
    n = plaintext_hello(fx->d.listen, true, got, sizeof got);
    assert_true(n == 0 || got[0] == 0x15);
    assert_true(tp_daemon_log_count(&fx->d, "no HELLO within 3 heartbeats") >= 1);

    struct wk *plain = wk_start(fx, "plain", "a", (struct wk_opts){.tls = 0});
    wk_expect_refused(plain);

    struct wk *good = wk_start(fx, "good", "a", (struct wk_opts){.tls = 1, .ca = fx->c->ca});
    insert_tasks(fx, "a", 200);
    wait_done(fx, "a", 200);
    assert_int_equal(atomic_load(&good->done), 200);
    assert_int_equal(wk_stats(plain).tasks_received, 0);
    assert_true(tp_daemon_log_count(&fx->d, "closed before HELLO: TLS") >= 2);
    assert_daemon_alive(fx);
    fx->passed = true;
}

static void client_cert_required(void **state)
{
    struct fx *fx = *state;
    fx_daemon(fx, "tls_client_cert", true, NULL);
    struct wk *none = wk_start(fx, "no-cert", "a", (struct wk_opts){.tls = 1, .ca = fx->c->ca});
    struct wk *other = wk_start(fx, "other-ca-cert", "a",
                                (struct wk_opts){.tls = 1, .ca = fx->c->ca, .cert = fx->c->other_client,
                                                 .key = fx->c->other_client_key});
    wk_expect_refused(none);
    wk_expect_refused(other);
    assert_true(tp_daemon_log_count(&fx->d, "peer did not return a certificate") >= 1);

    struct wk *good = wk_start(fx, "ca-cert", "a",
                               (struct wk_opts){.tls = 1, .ca = fx->c->ca, .cert = fx->c->client,
                                                .key = fx->c->client_key});
    insert_tasks(fx, "a", 200);
    wait_done(fx, "a", 200);
    assert_int_equal(atomic_load(&good->done), 200);
    assert_int_equal(wk_stats(none).tasks_received, 0);
    assert_int_equal(wk_stats(other).tasks_received, 0);

    /* taskpush-worker with the same flags runs tasks through its command. */
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec '%s' --connect %s --type x --exec cat --tls --tls-ca '%s' --tls-cert '%s' --tls-key '%s' "
             "--name cli 2>>'%s/cli.log'",
             tp_build_path("worker-client/taskpush-worker"), fx->d.listen, fx->c->ca, fx->c->client,
             fx->c->client_key, fx->c->dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    insert_tasks(fx, "x", 20);
    long long end = tp_mono_ms() + WAIT_MS;
    uint64_t ok;
    while ((ok = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_type = 'x' AND task_state = 2 "
                                              "AND result = payload")) != 20 &&
           tp_mono_ms() < end)
        tp_sleep_ms(POLL_MS);
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    if (ok != 20)
        sh("cat '%s/cli.log' >&2", fx->c->dir);
    assert_int_equal(ok, 20);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    fx->passed = true;
}

/* Runs a command line with stdout and stderr into out; returns its exit status. */
static int run(char *out, size_t outlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int run(char *out, size_t outlen, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    printf("# $ %s -> %d\n", cmd, rc);
    return rc;
}

static const char *ctl_path(void)
{
    static char path[1024];
    snprintf(path, sizeof path, "env -u TASKPUSH_TOKEN -u TASKPUSH_ADMIN '%s'",
             tp_build_path("ctl/taskpushctl"));
    return path;
}

static void admin_over_tls(void **state)
{
    struct fx *fx = *state;
    /* With --tls-ca the worker port wants client certificates; the admin port must not. */
    fx_daemon(fx, "tls_admin", true, NULL);
    char out[16384];
    long long end = tp_mono_ms() + WAIT_MS;
    for (;;) {
        int rc = run(out, sizeof out, "%s --tls-ca '%s' --admin https://%s --json stats", ctl_path(), fx->c->ca,
                     fx->d.admin);
        json_t *o = rc == 0 ? json_loads(out, 0, NULL) : NULL;
        bool leader = json_is_true(json_object_get(o, "leader"));
        json_decref(o);
        if (leader)
            break;
        if (tp_mono_ms() > end)
            fail_msg("taskpushctl over TLS never showed a leader: %s", out);
        tp_sleep_ms(200);
    }
    assert_int_equal(run(out, sizeof out, "%s --tls --tls-ca '%s' --admin %s stats", ctl_path(), fx->c->ca, fx->d.admin),
                     0);
    assert_non_null(strstr(out, "database    reachable"));
    assert_non_null(strstr(out, "workers"));
    assert_int_equal(run(out, sizeof out, "%s --tls-ca '%s' --admin https://%s/ health", ctl_path(), fx->c->ca,
                         fx->d.admin),
                     0);
    assert_non_null(strstr(out, "ok"));

    /* The wrong CA: no answer, and the reason. */
    assert_int_equal(run(out, sizeof out, "%s --tls-ca '%s' --admin https://%s stats", ctl_path(), fx->c->other_ca,
                         fx->d.admin),
                     1);
    assert_non_null(strstr(out, "certificate verify failed"));
    /* Plain HTTP to the TLS port: no HTTP answer at all. */
    assert_int_equal(run(out, sizeof out, "%s --admin http://%s stats", ctl_path(), fx->d.admin), 1);
    assert_non_null(strstr(out, "no answer"));
    char *body = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/stats", &body), -1);
    free(body);
    uint8_t got[4096];
    /* A raw GET: the daemon closes without a byte of HTTP. */
    {
        int fd = tp_raw_connect(fx->d.admin, 10);
        assert_true(fd >= 0);
        static const char get[] = "GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        assert_int_equal(send(fd, get, sizeof get - 1, MSG_NOSIGNAL), (ssize_t)(sizeof get - 1));
        size_t len = 0;
        ssize_t r = 0;
        while (len < sizeof got - 1 && (r = recv(fd, got + len, sizeof got - 1 - len, 0)) > 0)
            len += (size_t)r;
        if (len == 0 && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            fail_msg("the admin port kept a plaintext connection open for 10 s");
        got[len] = '\0';
        close(fd);
        printf("# plaintext GET on the TLS admin port: %zu bytes back\n", len);
        assert_null(strstr((const char *)got, "HTTP/"));
    }
    /* Still answering over TLS. */
    assert_daemon_alive(fx);
    assert_int_equal(run(out, sizeof out, "%s --tls-ca '%s' --admin https://%s health", ctl_path(), fx->c->ca,
                         fx->d.admin),
                     0);
    fx->passed = true;
}

static void bad_flags(void **state)
{
    struct fx *fx = *state;
    const struct certs *c = fx->c;
    const char *d = tp_build_path("dispatcher/taskpushd");
    char daemon[1100];
    snprintf(daemon, sizeof daemon, "env -u TASKPUSH_DB '%s' --db mysql://u@127.0.0.1:1/d --listen 127.0.0.1:0 "
                                    "--admin 127.0.0.1:0",
             d);
    char out[8192];
    assert_int_equal(run(out, sizeof out, "%s --tls-cert '%s'", daemon, c->server), 2);
    assert_non_null(strstr(out, "--tls-cert needs --tls-key"));
    assert_int_equal(run(out, sizeof out, "%s --tls-key '%s'", daemon, c->server_key), 2);
    assert_non_null(strstr(out, "--tls-key needs --tls-cert"));
    assert_int_equal(run(out, sizeof out, "%s --tls-ca '%s'", daemon, c->ca), 2);
    assert_non_null(strstr(out, "--tls-ca needs"));
    assert_int_equal(run(out, sizeof out, "%s --tls-cert '%s/missing.pem' --tls-key '%s'", daemon, c->dir, c->server_key),
                     2);
    assert_non_null(strstr(out, "missing.pem"));
    assert_int_equal(run(out, sizeof out, "%s --tls-cert '%s' --tls-key '%s'", daemon, c->server, c->client_key), 2);
    assert_non_null(strstr(out, "--tls-key"));
    assert_int_equal(run(out, sizeof out, "%s --tls-cert '%s' --tls-key '%s' --tls-ca '%s'", daemon, c->server,
                         c->server_key, c->server_key),
                     2);
    assert_non_null(strstr(out, "--tls-ca"));

    const char *w = tp_build_path("worker-client/taskpush-worker");
    char worker[1100];
    snprintf(worker, sizeof worker, "'%s' --connect 127.0.0.1:1 --type t --exec true", w);
    assert_int_equal(run(out, sizeof out, "%s --tls --tls-cert '%s'", worker, c->client), 2);
    assert_non_null(strstr(out, "--tls-cert needs --tls-key"));
    assert_int_equal(run(out, sizeof out, "%s --tls-ca '%s'", worker, c->ca), 2);
    assert_non_null(strstr(out, "--tls"));
    assert_int_equal(run(out, sizeof out, "%s --tls --tls-ca '%s/missing.pem'", worker, c->dir), 2);
    assert_non_null(strstr(out, "missing.pem"));

    assert_int_equal(run(out, sizeof out, "%s --tls --tls-ca '%s/missing.pem' --admin 127.0.0.1:1 stats", ctl_path(),
                         c->dir),
                     2);
    assert_non_null(strstr(out, "missing.pem"));
    assert_int_equal(run(out, sizeof out, "%s --tls-ca '%s' --admin 127.0.0.1:1 stats", ctl_path(), c->ca), 2);
    assert_int_equal(run(out, sizeof out, "%s --admin ftp://127.0.0.1:1 stats", ctl_path()), 2);
    fx->passed = true;
}

int main(void)
{
    static struct certs certs;
    if (certs_make(&certs) != 0) {
        certs_remove(&certs);
        printf("not ok 1 - test certificates could not be made\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(tls_worker_completes, fx_setup, fx_teardown, &certs),
        cmocka_unit_test_prestate_setup_teardown(wrong_ca_or_name, fx_setup, fx_teardown, &certs),
        cmocka_unit_test_prestate_setup_teardown(plaintext_refused, fx_setup, fx_teardown, &certs),
        cmocka_unit_test_prestate_setup_teardown(client_cert_required, fx_setup, fx_teardown, &certs),
        cmocka_unit_test_prestate_setup_teardown(admin_over_tls, fx_setup, fx_teardown, &certs),
        cmocka_unit_test_prestate_setup_teardown(bad_flags, fx_setup, fx_teardown, &certs),
    };
    int rc = cmocka_run_group_tests_name("tls", tests, NULL, NULL);
    certs_remove(&certs);
    return rc;
}
