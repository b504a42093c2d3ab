/* team_queue: a team's queue as it is before taskpush (docs/adopting.md), for the
 * cut-over tests: its pollers and its producer, each a process of its own.
 *
 *   team_queue poll    DB_OPTS --name NAME --log FILE [--seconds N] [--idle-ms MS]
 *   team_queue produce DB_OPTS --rate R --log FILE [--seconds N]
 *   DB_OPTS: --host H --port P --user U [--password W] --db NAME [--table task]
 *
 * The table has the team's codes: task_state NEW=1 PROCESSING=2 SUCCESSFUL=3 FAILED=4,
 * task_priority LOW=0 NORMAL=1 HIGH=2, times in ms since 1970.
 *
 * poll: the compare-and-set poller teams run by the hundred, exactly:
 *     SELECT task_id FROM task WHERE task_state = 1 AND task_priority = P LIMIT 1
 *       (P = HIGH, then NORMAL, then LOW)
 *     UPDATE task SET task_state = 2, last_update_time = NOW WHERE task_id = ? AND
 *       task_state = 1                                   -- 0 rows: another poller won
 *   and for each row it won, the execution: one line "TASK_ID NAME\n" appended to FILE
 *   with a single write() on an O_APPEND descriptor (whole or absent, even under kill -9),
 *   then UPDATE ... SET task_state = 3. Idle (no NEW row): sleeps MS (default 20).
 * produce: inserts one NEW row of a rotating priority every 1/R s, and appends
 *   "TASK_ID\n" to FILE for each insert that committed; an insert that fails is counted,
 *   never retried (the test asserts there were none).
 *
 * Both stop at SIGTERM/SIGINT or after N seconds (default 600: a bound, so a test that
 * forgets one cannot leave it running), and print one line of counts on stdout:
 *   poll:    "executed E misses M selects S errors X"
 *   produce: "inserted I errors X"
 * Exit 0; a bad argument 2; a database that cannot be reached at start 1. A connection
 * lost later is reconnected (an error counted), as the team's pollers do.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mysql.h>

struct opts {
    const char *host, *user, *password, *db, *table, *name, *log;
    unsigned port;
    double rate;
    long seconds;
    long idle_ms;
};

struct counts {
    uint64_t executed, misses, selects, inserted, errors;
};

/* Set by the signal handler only; read by the loops. */
static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !stopping)
        ;
}

static MYSQL *connect_db(const struct opts *o)
{
    MYSQL *m = mysql_init(NULL);
    unsigned timeout = 5, proto = MYSQL_PROTOCOL_TCP;

    if (!m)
        return NULL;
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &timeout);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &timeout);
    mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    if (!mysql_real_connect(m, o->host, o->user, o->password, o->db, o->port, NULL, 0)) {
        fprintf(stderr, "team_queue: %s (error %u)\n", mysql_error(m), mysql_errno(m));
        mysql_close(m);
        return NULL;
    }
    return m;
}

/* Runs sql; returns the affected rows, or -1 (counted as an error). */
static int64_t exec(MYSQL *m, const char *sql, struct counts *c)
{
    if (mysql_query(m, sql) != 0) {
        c->errors++;
        fprintf(stderr, "team_queue: %s (error %u) in: %.120s\n", mysql_error(m), mysql_errno(m), sql);
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(m);
    if (res) {
        mysql_free_result(res);
        return 0;
    }
    return (int64_t)mysql_affected_rows(m);
}

/* The first task_id of a NEW row of priority p, 0 when none, -1 on error. */
static int64_t select_new(MYSQL *m, const struct opts *o, int p, struct counts *c)
{
    char sql[256];
    int64_t id = 0;

    snprintf(sql, sizeof sql, "SELECT task_id FROM %s WHERE task_state = 1 AND task_priority = %d LIMIT 1",
             o->table, p);
    c->selects++;
    if (mysql_query(m, sql) != 0) {
        c->errors++;
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(m);
    if (!res) {
        c->errors++;
        return -1;
    }
    MYSQL_ROW row = mysql_fetch_row(res);
    if (row && row[0])
        id = strtoll(row[0], NULL, 10);
    mysql_free_result(res);
    return id;
}

static int record(int fd, const char *line)
{
    size_t n = strlen(line);
    return write(fd, line, n) == (ssize_t)n ? 0 : -1;
}

static void poll_loop(MYSQL **mp, const struct opts *o, int fd, struct counts *c, int64_t end)
{
    char sql[256], line[128];

    while (!stopping && mono_ms() < end) {
        int64_t id = 0;
        for (int p = 2; p >= 0 && id == 0; p--)
            id = select_new(*mp, o, p, c);
        if (id < 0) { /* the connection may be gone: start again on a new one */
            MYSQL *m = connect_db(o);
            if (m) {
                mysql_close(*mp);
                *mp = m;
            } else {
                sleep_ms(100);
            }
            continue;
        }
        if (id == 0) {
            sleep_ms(o->idle_ms);
            continue;
        }
        snprintf(sql, sizeof sql,
                 "UPDATE %s SET task_state = 2, last_update_time = %" PRId64
                 " WHERE task_id = %" PRId64 " AND task_state = 1",
                 o->table, now_ms(), id);
        int64_t won = exec(*mp, sql, c);
        if (won == 0)
            c->misses++;
        if (won != 1)
            continue;
        snprintf(line, sizeof line, "%" PRId64 " %s\n", id, o->name);
        if (record(fd, line) < 0)
            c->errors++;
        c->executed++;
        snprintf(sql, sizeof sql, "UPDATE %s SET task_state = 3, last_update_time = %" PRId64
                                  " WHERE task_id = %" PRId64,
                 o->table, now_ms(), id);
        exec(*mp, sql, c);
    }
}

static void produce_loop(MYSQL *m, const struct opts *o, int fd, struct counts *c, int64_t end)
{
    char sql[320], line[64];
    int64_t start = mono_ms();

    for (uint64_t n = 0; !stopping && mono_ms() < end; n++) {
        int64_t due = start + (int64_t)((double)n * 1000.0 / o->rate);
        int64_t wait = due - mono_ms();
        if (wait > 0)
            sleep_ms((long)wait);
        if (stopping)
            break;
        int64_t t = now_ms();
        snprintf(sql, sizeof sql,
                 "INSERT INTO %s (task_state, task_priority, insert_time, last_update_time, payload)"
                 " VALUES (1, %d, %" PRId64 ", %" PRId64 ", 'produced-%" PRIu64 "')",
                 o->table, (int)(n % 3), t, t, n);
        if (exec(m, sql, c) != 1)
            continue;
        snprintf(line, sizeof line, "%" PRIu64 "\n", (uint64_t)mysql_insert_id(m));
        if (record(fd, line) < 0)
            c->errors++;
        c->inserted++;
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: team_queue poll|produce --host H --port P --user U [--password W] --db NAME"
                    " [--table T] --log FILE [--name NAME] [--rate R] [--seconds N] [--idle-ms MS]\n");
    return 2;
}

static bool valid_identifier(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (i > 0 && s[i] >= '0' && s[i] <= '9')))
            return false;
    return true;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"host", required_argument, NULL, 'h'},     {"port", required_argument, NULL, 'P'},
        {"user", required_argument, NULL, 'u'},     {"password", required_argument, NULL, 'p'},
        {"db", required_argument, NULL, 'd'},       {"table", required_argument, NULL, 't'},
        {"name", required_argument, NULL, 'n'},     {"log", required_argument, NULL, 'l'},
        {"rate", required_argument, NULL, 'r'},     {"seconds", required_argument, NULL, 's'},
        {"idle-ms", required_argument, NULL, 'i'},  {NULL, 0, NULL, 0}};
    struct opts o = {.host = "127.0.0.1", .table = "task", .name = "poller", .rate = 50,
                     .seconds = 600, .idle_ms = 20};
    struct counts c = {0};
    bool poll;
    int opt;

    if (argc < 2)
        return usage();
    if (strcmp(argv[1], "poll") == 0)
        poll = true;
    else if (strcmp(argv[1], "produce") == 0)
        poll = false;
    else
        return usage();
    optind = 2;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h': o.host = optarg; break;
        case 'P': o.port = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'u': o.user = optarg; break;
        case 'p': o.password = optarg; break;
        case 'd': o.db = optarg; break;
        case 't': o.table = optarg; break;
        case 'n': o.name = optarg; break;
        case 'l': o.log = optarg; break;
        case 'r': o.rate = strtod(optarg, NULL); break;
        case 's': o.seconds = strtol(optarg, NULL, 10); break;
        case 'i': o.idle_ms = strtol(optarg, NULL, 10); break;
        default: return usage();
        }
    }
    if (optind != argc || !o.user || !o.db || !o.log || o.port == 0 || o.port > 65535 ||
        !valid_identifier(o.table) || strlen(o.name) > 64 || strchr(o.name, '\n') ||
        !(o.rate > 0 && o.rate <= 100000) || o.seconds <= 0 || o.seconds > 86400 || o.idle_ms < 0 ||
        o.idle_ms > 10000)
        return usage();

    int fd = open(o.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) {
        fprintf(stderr, "team_queue: %s: %s\n", o.log, strerror(errno));
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    MYSQL *m = connect_db(&o);
    if (!m) {
        close(fd);
        return 1;
    }
    int64_t end = mono_ms() + o.seconds * 1000;
    if (poll) {
        poll_loop(&m, &o, fd, &c, end);
        printf("executed %" PRIu64 " misses %" PRIu64 " selects %" PRIu64 " errors %" PRIu64 "\n",
               c.executed, c.misses, c.selects, c.errors);
    } else {
        produce_loop(m, &o, fd, &c, end);
        printf("inserted %" PRIu64 " errors %" PRIu64 "\n", c.inserted, c.errors);
    }
    mysql_close(m);
    close(fd);
    return 0;
}
