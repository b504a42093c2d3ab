/* Unit tests of taskpushd's settings (dispatcher/config.c): flags, the
 * --config file, the environment, and database URLs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

static int load(dsp_config *cfg, char *err, size_t errlen, ...)
{
    char *argv[32] = {"taskpushd"};
    int argc = 1;
    va_list ap;
    va_start(ap, errlen);
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    FILE *out = fopen("/dev/null", "w");
    int rc = dsp_config_load(cfg, argc, argv, out, err, errlen);
    fclose(out);
    return rc;
}

static int setup(void **state)
{
    (void)state;
    unsetenv("TASKPUSH_DB");
    unsetenv("TASKPUSH_DB_PASSWORD");
    unsetenv("TASKPUSH_TOKEN");
    unsetenv("TASKPUSH_ADMIN_TOKEN");
    return 0;
}

static void test_defaults_match_spec(void **state)
{
    (void)state;
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_string_equal(c.listen, "127.0.0.1:7070");
    assert_string_equal(c.admin, "127.0.0.1:7071");
    assert_int_equal(c.scheduler, DSP_SCHED_LEAST_LOADED);
    assert_int_equal(c.poll_ms, 100);
    assert_int_equal(c.task_timeout_ms, 60000);
    assert_int_equal(c.heartbeat_ms, 1000);
    assert_int_equal(c.log_level, DSP_LOG_INFO);
    assert_null(c.token);
    dsp_config_free(&c);
}

static void test_db_is_required(void **state)
{
    (void)state;
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, NULL), DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--db"));
    dsp_config_free(&c);
}

/* --migrate is an action on the command line: a flag without a value, off by default,
 * and no config-file key. */
static void test_migrate_flag(void **state)
{
    (void)state;
    dsp_config c;
    char err[256] = "";
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_false(c.migrate);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--migrate", "--db", "mysql://u@h/d", NULL),
                     DSP_CONFIG_OK);
    assert_true(c.migrate);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--migrate=1", NULL),
                     DSP_CONFIG_BAD);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--migrate", NULL), DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--db"));
    dsp_config_free(&c);

    char path[] = "/tmp/test_config_migrate_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("migrate = 1\n", f);
    fclose(f);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "unknown key 'migrate'"));
    dsp_config_free(&c);
    unlink(path);
}

static void test_bad_flags_are_refused(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"--scheduler", "random"}, {"--batch", "0"},          {"--batch", "12x"},
        {"--poll-ms", "-5"},       {"--log-level", "verbose"}, {"--listen", "7070"},
        {"--heartbeat-ms", ""},    {"--lease-ms", "99"},       {"--lease-renew-ms", "9"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsp_config c;
        char err[256] = "";
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", (char *)cases[i][0],
                              (char *)cases[i][1], NULL),
                         DSP_CONFIG_BAD);
        assert_non_null(strstr(err, cases[i][0]));
        dsp_config_free(&c);
    }
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--frobnicate", NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "frobnicate"));
    dsp_config_free(&c);
}


/* --table NAME (issue 31): default task; a name taskpush can use unquoted, at most 36
 * bytes; the config file's key too; and, since getopt_long would take "--table" for an
 * abbreviation of --table-stats-ms, no flag is ever abbreviated. */
static void test_table_flag(void **state)
{
    (void)state;
    dsp_config c;
    char err[256] = "";

    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_string_equal(c.table, "task");
    assert_int_equal(c.table_stats_ms, 2000);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--table", "jobs", NULL),
                     DSP_CONFIG_OK);
    assert_string_equal(c.table, "jobs");
    assert_int_equal(c.table_stats_ms, 2000); /* not --table-stats-ms */
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--table=mail_2", NULL),
                     DSP_CONFIG_OK);
    assert_string_equal(c.table, "mail_2");
    dsp_config_free(&c);

    static const char *const bad[] = {"", "9jobs", "jobs-x", "jo bs", "jobs;", "`jobs`",
                                      "t\xc3\xa4sk",
                                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" /* 37 */};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--table", (char *)bad[i],
                              NULL),
                         DSP_CONFIG_BAD);
        assert_non_null(strstr(err, "--table"));
        dsp_config_free(&c);
    }
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--table",
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" /* 36 */, NULL),
                     DSP_CONFIG_OK);
    dsp_config_free(&c);

    /* With a shard, 'taskpush/NAME.' + a byte of the database's name + '.SHARD' must fit
     * MySQL's 64-byte lock name. */
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--table",
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" /* 36 */, "--types", "t",
                          "--shard", "ssssssssssssssssssss" /* 20 */, NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "lock name"));
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--table", "jobs", "--types",
                          "t", "--shard", "ssssssssssssssssssss", NULL),
                     DSP_CONFIG_OK);
    dsp_config_free(&c);

    /* The config file's key. */
    char path[] = "/tmp/test_config_table_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("table = mail\n", f);
    fclose(f);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, NULL),
                     DSP_CONFIG_OK);
    assert_string_equal(c.table, "mail");
    dsp_config_free(&c);
    f = fopen(path, "w");
    fputs("table = mail-box\n", f);
    fclose(f);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "mail-box"));
    dsp_config_free(&c);
    unlink(path);
}

/* --sql-dialect: auto by default, mysql and mariadb taken (flag and config key), anything
 * else a bad flag naming it. */
static void test_sql_dialect(void **state)
{
    (void)state;
    dsp_config c;
    char err[256] = "";
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_int_equal(c.sql_dialect, DSP_SQL_DIALECT_AUTO);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--sql-dialect", "mysql", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.sql_dialect, DSP_SQL_DIALECT_MYSQL);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--sql-dialect=mariadb", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.sql_dialect, DSP_SQL_DIALECT_MARIADB);
    dsp_config_free(&c);
    static const char *const bad[] = {"MySQL", "oracle", "", "mysql8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--sql-dialect", (char *)bad[i], NULL),
                         DSP_CONFIG_BAD);
        assert_non_null(strstr(err, "--sql-dialect"));
        dsp_config_free(&c);
    }
    char path[] = "/tmp/taskpush-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "sql-dialect = mysql\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, NULL), DSP_CONFIG_OK);
    assert_int_equal(c.sql_dialect, DSP_SQL_DIALECT_MYSQL);
    dsp_config_free(&c);
    unlink(path);
}

/* --wake: auto by default, binlog and poll taken (flag and config key), anything else a
 * bad flag naming it; /config shows it back. */
static void test_wake(void **state)
{
    (void)state;
    dsp_config c;
    char err[256] = "";
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_int_equal(c.wake, DSP_WAKE_AUTO);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--wake", "binlog", NULL), DSP_CONFIG_OK);
    assert_int_equal(c.wake, DSP_WAKE_BINLOG);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--wake=poll", NULL), DSP_CONFIG_OK);
    assert_int_equal(c.wake, DSP_WAKE_POLL);
    assert_string_equal(dsp_wake_mode_name(c.wake), "poll");
    dsp_config_free(&c);
    static const char *const bad[] = {"BINLOG", "push", "", "binlog,poll"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--wake", (char *)bad[i], NULL),
                         DSP_CONFIG_BAD);
        assert_non_null(strstr(err, "--wake"));
        dsp_config_free(&c);
    }
    char path[] = "/tmp/taskpush-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "wake = binlog\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, NULL), DSP_CONFIG_OK);
    assert_int_equal(c.wake, DSP_WAKE_BINLOG);
    dsp_config_free(&c);
    unlink(path);
}

static void test_no_abbreviations(void **state)
{
    (void)state;
    static const char *const abbrev[][2] = {
        {"--table-stats", "100"}, {"--table-stats=100", NULL}, {"--sched", "round-robin"},
        {"--mig", NULL},          {"--hel", NULL},             {"--vers", NULL},
        {"--lease-renew", "100"}, {"--po", "100"},
    };
    for (size_t i = 0; i < sizeof abbrev / sizeof abbrev[0]; i++) {
        dsp_config c;
        char err[256] = "";
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", (char *)abbrev[i][0],
                              (char *)abbrev[i][1], NULL),
                         DSP_CONFIG_BAD);
        assert_non_null(strstr(err, "unknown option"));
        dsp_config_free(&c);
    }
    /* It names the flag it could have meant. */
    dsp_config c;
    char err[256] = "";
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--table-stats", "100", NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "'--table-stats'"));
    assert_non_null(strstr(err, "--table-stats-ms"));
    dsp_config_free(&c);
    /* Whole names, both forms, still work. */
    assert_int_equal(load(&c, err, sizeof err, "--db=mysql://u@h/d", "--table-stats-ms", "100",
                          "--poll-ms=50", "--migrate", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.table_stats_ms, 100);
    assert_int_equal(c.poll_ms, 50);
    dsp_config_free(&c);
}

/* The lease flags: unset by default (the database threads choose for the server: 1000/250
 * on one server, 5000/1000 on Galera), and renewals at most half a lease; one flag alone
 * is checked against the other's one-server default. */
static void test_lease_flags(void **state)
{
    (void)state;
    dsp_config c;
    char err[256] = "";

    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_int_equal(c.lease_ms, 0);
    assert_int_equal(c.lease_renew_ms, 0);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--lease-ms", "5000", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.lease_ms, 5000);
    assert_int_equal(c.lease_renew_ms, 0);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--lease-ms", "400", NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--lease-renew-ms 250 must be at most half of --lease-ms 400"));
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--lease-renew-ms", "600", NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--lease-renew-ms 600 must be at most half of --lease-ms 1000"));
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--lease-ms", "400",
                          "--lease-renew-ms", "200", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.lease_ms, 400);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--lease-ms", "400",
                          "--lease-renew-ms", "201", NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--lease-renew-ms 201 must be at most half of --lease-ms 400"));
    dsp_config_free(&c);
}

/* What the daemon prints for a bound address is an address its flags take back. */
static void test_hostport_format(void **state)
{
    (void)state;
    char out[64], host[48];
    unsigned port;
    dsp_hostport_format(out, sizeof out, "127.0.0.1", 7070);
    assert_string_equal(out, "127.0.0.1:7070");
    dsp_hostport_format(out, sizeof out, "::1", 7070);
    assert_string_equal(out, "[::1]:7070");
    assert_int_equal(dsp_hostport_parse(out, host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 7070);
    dsp_hostport_format(out, sizeof out, "localhost", 0);
    assert_string_equal(out, "localhost:0");
}

/* HOST:PORT of --listen and --admin: what is taken, and what each refusal says. */
static void test_hostport_rules(void **state)
{
    (void)state;
    static const struct {
        const char *in, *host;
        unsigned port;
    } good[] = {
        {"127.0.0.1:7070", "127.0.0.1", 7070}, {"[::1]:0", "::1", 0},
        {"0.0.0.0:65535", "0.0.0.0", 65535},   {"db-1.example:08", "db-1.example", 8},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char host[64];
        unsigned port = 1;
        assert_int_equal(dsp_hostport_split(good[i].in, host, sizeof host, &port, NULL, 0), 0);
        assert_string_equal(host, good[i].host);
        assert_int_equal(port, good[i].port);
    }
    static const struct {
        const char *in, *says;
    } bad[] = {
        {"http://127.0.0.1:7070", "no scheme"},  {"127.0.0.1:7070/x", "no path"},
        {"127.0.0.1:99999", "0 to 65535"},       {"127.0.0.1:+80", "0 to 65535"},
        {"127.0.0.1:", "0 to 65535"},            {":7070", "the host is empty"},
        {"[]:7070", "the host is empty"},        {"::1:7070", "write an IPv6 address as [ADDR]:PORT"},
        {"[::1]", "[ADDR]:PORT"},                {"7070", "no port"},
        {"a b:1", "white space"},                {"u@h:1", "user name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char host[64], why[96] = "";
        unsigned port;
        assert_int_equal(dsp_hostport_split(bad[i].in, host, sizeof host, &port, why, sizeof why), -1);
        if (!strstr(why, bad[i].says))
            fail_msg("'%s' gave \"%s\", not \"%s\"", bad[i].in, why, bad[i].says);
    }
    /* As a flag: the flag, the value and the reason in one line. */
    dsp_config c;
    char err[256] = "";
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--admin", "http://127.0.0.1:7071", NULL),
                     DSP_CONFIG_BAD);
    assert_string_equal(err, "--admin 'http://127.0.0.1:7071': no scheme such as http:// (give HOST:PORT)");
    dsp_config_free(&c);
}

static void test_help_and_version_exit_zero(void **state)
{
    (void)state;
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--help", NULL), DSP_CONFIG_EXIT_OK);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--version", NULL), DSP_CONFIG_EXIT_OK);
    dsp_config_free(&c);
}

static void test_flags_override_config_file_and_env(void **state)
{
    (void)state;
    char path[] = "/tmp/taskpush-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "# a comment\n"
                       "scheduler = round-robin\n"
                       "batch = 250\n"
                       "db = mysql://file@h/fromfile\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    setenv("TASKPUSH_DB", "mysql://env@h/fromenv", 1);
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--config", path, "--batch", "500", NULL), DSP_CONFIG_OK);
    assert_int_equal(c.scheduler, DSP_SCHED_ROUND_ROBIN); /* from the file */
    assert_int_equal(c.batch, 500);                       /* the flag wins */
    assert_string_equal(c.db_url.dbname, "fromenv");      /* the environment beats the file */
    dsp_config_free(&c);
    unlink(path);
}

static void test_config_file_unknown_key(void **state)
{
    (void)state;
    char path[] = "/tmp/taskpush-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "bogus = 1\n", 10), 10);
    close(fd);
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "bogus"));
    dsp_config_free(&c);
    unlink(path);
}

static void test_url_tcp_with_password_and_port(void **state)
{
    (void)state;
    dsp_db_url u;
    char err[256];
    assert_int_equal(dsp_db_url_parse("mysql://bob:s3cr:t@db.example:3307/jobs", &u, err, sizeof err), 0);
    assert_string_equal(u.user, "bob");
    assert_string_equal(u.password, "s3cr:t");
    assert_string_equal(u.host, "db.example");
    assert_int_equal(u.port, 3307);
    assert_string_equal(u.dbname, "jobs");
    assert_null(u.socket);
    dsp_db_url_clear(&u);
}

static void test_url_socket_only_without_port(void **state)
{
    (void)state;
    dsp_db_url u;
    char err[256];
    assert_int_equal(dsp_db_url_parse("mysql://bob@localhost/jobs?socket=/run/my.sock", &u, err, sizeof err), 0);
    assert_string_equal(u.socket, "/run/my.sock");
    assert_null(u.password);
    assert_int_equal(u.port, 0);
    dsp_db_url_clear(&u);
    /* docs/taskpushd.md: a URL with a port always connects over TCP */
    assert_int_equal(dsp_db_url_parse("mysql://bob@localhost:3306/jobs?socket=/run/my.sock", &u, err, sizeof err), 0);
    assert_null(u.socket);
    assert_int_equal(u.port, 3306);
    dsp_db_url_clear(&u);
}

static void test_url_node_list(void **state)
{
    (void)state;
    dsp_db_url u;
    char err[256];
    assert_int_equal(dsp_db_url_parse("mysql://bob:pw@n1:3306,[::1]:3307,n3/jobs", &u, err, sizeof err), 0);
    assert_int_equal(u.nnodes, 3);
    assert_string_equal(u.nodes[0].host, "n1");
    assert_int_equal(u.nodes[0].port, 3306);
    assert_string_equal(u.nodes[1].host, "::1");
    assert_int_equal(u.nodes[1].port, 3307);
    assert_string_equal(u.nodes[2].host, "n3");
    assert_int_equal(u.nodes[2].port, 0);
    assert_string_equal(u.host, "n1"); /* the first node, as a one-server URL has it */
    assert_int_equal(u.port, 3306);
    assert_string_equal(u.dbname, "jobs");
    dsp_db_url_clear(&u);
    assert_int_equal(dsp_db_url_parse("mysql://bob@one/jobs", &u, err, sizeof err), 0);
    assert_int_equal(u.nnodes, 1);
    dsp_db_url_clear(&u);

    static const char *const bad[][2] = {
        {"mysql://bob@n1,/jobs", "empty server"},
        {"mysql://bob@,n1/jobs", "no host"},
        {"mysql://bob@n1,,n2/jobs", "no host"},
        {"mysql://bob@n1:1,n2:x/jobs", "bad port"},
        {"mysql://bob@n1,n2/jobs?socket=/s", "names one server"},
        {"mysql://bob@a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q/jobs", "more than 16"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(dsp_db_url_parse(bad[i][0], &u, err, sizeof err), -1);
        if (strstr(err, bad[i][1]) == NULL)
            fail_msg("%s: '%s' does not say '%s'", bad[i][0], err, bad[i][1]);
    }
}

static void test_url_rejects_malformed(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "postgres://u@h/d", "mysql://h/d",        "mysql://u@h",        "mysql://u@h/",
        "mysql://u@h:x/d",  "mysql://u@h:0/d",    "mysql://u@h/d;drop", "mysql://u@h/d?ssl=1",
        "mysql://@h/d",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsp_db_url u;
        char err[256] = "";
        assert_int_equal(dsp_db_url_parse(bad[i], &u, err, sizeof err), -1);
        assert_true(err[0] != '\0');
    }
}

/* The brackets of an IPv6 host are not part of it, with or without a port;
 * without them a colon in the host is refused rather than read as a port. */
static void test_url_ipv6_host(void **state)
{
    (void)state;
    dsp_db_url u;
    char err[256] = "";
    assert_int_equal(dsp_db_url_parse("mysql://bob@[::1]:3307/jobs", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 3307);
    dsp_db_url_clear(&u);
    assert_int_equal(dsp_db_url_parse("mysql://bob@[fe80::1]/jobs", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "fe80::1");
    assert_int_equal(u.port, 0);
    dsp_db_url_clear(&u);
    static const char *const bad[] = {"mysql://bob@::1/jobs", "mysql://bob@[::1/jobs",
                                      "mysql://bob@[]/jobs", "mysql://bob@[::1]x/jobs",
                                      "mysql://bob@[::1]:0/jobs", "mysql://bob@[[::1]:5/jobs"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(dsp_db_url_parse(bad[i], &u, err, sizeof err), -1);
        assert_true(err[0] != '\0');
    }
}

/* A --config line too long for the parser is refused, not cut in two: its
 * tail must not be read as a setting of its own. */
static void test_config_file_long_line(void **state)
{
    (void)state;
    char path[] = "/tmp/taskpush-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs("ready-file = /tmp/", f);
    for (int i = 0; i < 5000; i++)
        fputc('a', f);
    fputs("batch = 7\n", f);
    fclose(f);
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, ":1: a line must be"));
    dsp_config_free(&c);
    unlink(path);
}

static void test_password_from_environment(void **state)
{
    (void)state;
    setenv("TASKPUSH_DB_PASSWORD", "hidden", 1);
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h:1/d", NULL), DSP_CONFIG_OK);
    assert_string_equal(c.db_url.password, "hidden");
    dsp_config_free(&c);
}

static void test_token_file_and_env(void **state)
{
    (void)state;
    char path[] = "/tmp/taskpush-token-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "  tok3n\n", 8), 8);
    close(fd);
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--token-file", path, NULL), DSP_CONFIG_OK);
    assert_string_equal(c.token, "tok3n");
    dsp_config_free(&c);
    unlink(path);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--token-file", path, NULL), DSP_CONFIG_BAD);
    dsp_config_free(&c);
    setenv("TASKPUSH_TOKEN", "envtok", 1);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_string_equal(c.token, "envtok");
    dsp_config_free(&c);
}

static void no_secret_shown(void *arg, const char *key, const char *val)
{
    (void)arg;
    (void)key;
    assert_null(strstr(val, "adm1n"));
}

/* --admin-token-file (or TASKPUSH_ADMIN_TOKEN) is kept apart from the workers' token,
 * the file before the environment; its value never shows in the settings. */
static void test_admin_token_file_and_env(void **state)
{
    (void)state;
    char path[] = "/tmp/taskpush-admin-token-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "adm1n-tok\n", 10), 10);
    close(fd);
    dsp_config c;
    char err[256];
    setenv("TASKPUSH_TOKEN", "workertok", 1);
    setenv("TASKPUSH_ADMIN_TOKEN", "adm1n-env", 1);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--admin-token-file", path, NULL),
                     DSP_CONFIG_OK);
    assert_string_equal(c.admin_token, "adm1n-tok");
    assert_string_equal(c.token, "workertok");
    dsp_config_each(&c, no_secret_shown, NULL);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_string_equal(c.admin_token, "adm1n-env");
    dsp_config_free(&c);
    unsetenv("TASKPUSH_ADMIN_TOKEN");
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", NULL), DSP_CONFIG_OK);
    assert_null(c.admin_token); /* admin POSTs then take the workers' token */
    dsp_config_free(&c);
    unlink(path);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--admin-token-file", path, NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--admin-token-file"));
    dsp_config_free(&c);
    unsetenv("TASKPUSH_TOKEN");
}

static void count_setting(void *arg, const char *key, const char *val)
{
    (void)val;
    (*(int *)arg)++;
    assert_true(key[0] != '\0');
    if (strcmp(key, "db") == 0)
        assert_null(strstr(val, "pw")); /* a password is never shown */
}

static void test_settings_listing_hides_secrets(void **state)
{
    (void)state;
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u:pw@h/d", NULL), DSP_CONFIG_OK);
    int n = 0;
    dsp_config_each(&c, count_setting, &n);
    assert_true(n >= 10);
    dsp_config_free(&c);
}

static void test_durations(void **state)
{
    (void)state;
    int64_t ms;
    assert_int_equal(dsp_duration_parse("7d", &ms), 0);
    assert_int_equal(ms, 7LL * 86400000);
    assert_int_equal(dsp_duration_parse("90s", &ms), 0);
    assert_int_equal(ms, 90000);
    assert_int_equal(dsp_duration_parse("250", &ms), 0);
    assert_int_equal(ms, 250);
    assert_int_equal(dsp_duration_parse("keep", &ms), 0);
    assert_int_equal(ms, 0);
    assert_int_equal(dsp_duration_parse("12x", &ms), -1);
    assert_int_equal(dsp_duration_parse("-1h", &ms), -1);
    assert_int_equal(dsp_duration_parse("h", &ms), -1);
    assert_int_equal(dsp_duration_parse("99999999999999999d", &ms), -1);
    dsp_config c;
    char err[256];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--retain-finished", "2h", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.retain_finished_ms, 7200000);
    assert_int_equal(c.retain_failed_ms, 0);
    dsp_config_free(&c);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--retain-failed", "soon", NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--retain-failed"));
    dsp_config_free(&c);
}

/* One rule for every duration flag and key (docs/taskpushd.md, "Durations"): units
 * everywhere, a bare number in the unit of the flag's name (ms), garbage and overflow
 * refused with the flag named. */
static void test_duration_flags(void **state)
{
    (void)state;
    int64_t ms;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {{"0", 0}, {"30000", 30000}, {"250ms", 250}, {"30s", 30000}, {"5m", 300000},
                {"2h", 7200000}, {"1d", 86400000}, {"9223372036854775807", INT64_MAX},
                {"106751991167d", 106751991167LL * 86400000}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(dsp_duration_ms(good[i].text, &ms), 0);
        assert_true(ms == good[i].ms);
    }
    static const char *const bad[] = {"", "s", "ms", "-1", "+30s", " 30s", "30 s", "30s ", "1.5s", "1e3",
                                      "30sec", "30S", "0x10", "30s5", "keep", "9223372036854775808",
                                      "99999999999999999999", "106751991168d", "9223372036854775807s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (dsp_duration_ms(bad[i], &ms) != -1)
            fail_msg("'%s' was taken as %lld ms", bad[i], (long long)ms);

    dsp_config c;
    char err[512];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--task-timeout-ms", "30s",
                          "--heartbeat-ms", "2m", "--poll-ms", "250", "--lease-ms", "1s", "--lease-renew-ms",
                          "250ms", "--retain-finished", "7d", "--retry-backoff-max-ms", "1h", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.task_timeout_ms, 30000);
    assert_int_equal(c.heartbeat_ms, 120000);
    assert_int_equal(c.poll_ms, 250);
    assert_int_equal(c.lease_ms, 1000);
    assert_int_equal(c.lease_renew_ms, 250);
    assert_int_equal(c.retain_finished_ms, 7LL * 86400000);
    assert_int_equal(c.retry_backoff_max_ms, 3600000);
    dsp_config_free(&c);
    /* Garbage, and values beyond the flag's range however written: the flag is named. */
    static const char *const refused[][2] = {
        {"--task-timeout-ms", "30x"}, {"--task-timeout-ms", "25d"}, {"--heartbeat-ms", "2d"},
        {"--poll-ms", "0s"},          {"--lease-ms", "1.5s"},       {"--task-timeout-ms", "99999999999999999999"},
        {"--adopt-grace-ms", "keep"}, {"--retain-failed", "7 d"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", refused[i][0], refused[i][1], NULL),
                         DSP_CONFIG_BAD);
        if (!strstr(err, refused[i][0]))
            fail_msg("%s %s: \"%s\" does not name the flag", refused[i][0], refused[i][1], err);
        dsp_config_free(&c);
    }
    /* The config file's keys take the same text. */
    dsp_config f;
    memset(&f, 0, sizeof f);
    static const char text[] = "task-timeout-ms = 1h\norphan-grace-ms = 10s\nretain-finished = 12h\n";
    FILE *in = fmemopen((void *)text, sizeof text - 1, "r");
    assert_non_null(in);
    assert_int_equal(dsp_config_apply_file(&f, in, "t.conf", err, sizeof err), 0);
    fclose(in);
    assert_int_equal(f.task_timeout_ms, 3600000);
    assert_int_equal(f.orphan_grace_ms, 10000);
    assert_int_equal(f.retain_finished_ms, 12LL * 3600000);
    dsp_config_free(&f);
}

static void test_type_limits(void **state)
{
    (void)state;
    dsp_config c;
    char err[512];
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--type-limit", "mail:concurrency=3,rate=10",
                          "--type-limit", "a:b:rate=5", "--type-limit", "mail:concurrency=4", NULL),
                     DSP_CONFIG_OK);
    assert_int_equal(c.ntype_limits, 2);
    assert_string_equal(c.type_limits[0].type, "mail"); /* the later one replaced it */
    assert_int_equal(c.type_limits[0].concurrency, 4);
    assert_int_equal(c.type_limits[0].rate, 0);
    assert_string_equal(c.type_limits[1].type, "a:b"); /* the last ':' ends the type */
    assert_int_equal(c.type_limits[1].rate, 5);
    dsp_config_free(&c);

    static const char *const bad[] = {
        "mail", ":rate=1", "mail:", "mail:rate", "mail:rate=", "mail:rate=x", "mail:rate=-1",
        "mail:rate=1000001", "mail:rate=99999999999", "mail:speed=3", "mail:rate=1,rate=2",
        "mail:rate=1,", "mail:,rate=1", "mail:rate=+1", "mail:concurrency=1 ",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--type-limit", bad[i], NULL),
                         DSP_CONFIG_BAD);
        assert_non_null(strstr(err, "--type-limit"));
        dsp_config_free(&c);
    }
    /* More entries than --max-types. */
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--max-types", "1", "--type-limit",
                          "a:rate=1", "--type-limit", "b:rate=1", NULL),
                     DSP_CONFIG_BAD);
    assert_non_null(strstr(err, "--max-types"));
    dsp_config_free(&c);
    /* The config file takes the same text; the largest values pass. */
    dsp_config f;
    memset(&f, 0, sizeof f);
    FILE *in = fmemopen((void *)"type-limit = x:concurrency=1000000,rate=1000000\n", 48, "r");
    assert_non_null(in);
    assert_int_equal(dsp_config_apply_file(&f, in, "t.conf", err, sizeof err), 0);
    fclose(in);
    assert_int_equal(f.ntype_limits, 1);
    assert_int_equal(f.type_limits[0].concurrency, 1000000);
    assert_int_equal(f.type_limits[0].rate, 1000000);
    dsp_config_free(&f);
}

/* --group-limit T:N is --type-limit T:per_group=N and changes only per_group; a later
 * --type-limit without per_group keeps it; the config file's entries say so (source),
 * a flag's too; malformed ones exit 2. */
static void test_group_limits(void **state)
{
    (void)state;
    dsp_config c;
    char err[512];
    char path[] = "/tmp/taskpush-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "type-limit = filed:rate=9\ngroup-limit = both:4\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--config", path, "--group-limit", "g:2",
                          "--type-limit", "g:concurrency=5", "--type-limit", "h:per_group=3,rate=1",
                          "--group-limit", "h:7", "--type-limit", "both:concurrency=1", NULL),
                     DSP_CONFIG_OK);
    unlink(path);
    assert_int_equal(c.ntype_limits, 4);
    for (size_t i = 0; i < c.ntype_limits; i++) {
        const dsp_type_limit *l = &c.type_limits[i];
        if (strcmp(l->type, "filed") == 0) {
            assert_int_equal(l->rate, 9);
            assert_int_equal(l->source, DSP_LIMIT_CONFIG);
        } else if (strcmp(l->type, "g") == 0) {
            assert_int_equal(l->concurrency, 5);
            assert_int_equal(l->per_group, 2); /* kept: the later entry did not name it */
            assert_int_equal(l->source, DSP_LIMIT_FLAG);
        } else if (strcmp(l->type, "h") == 0) {
            assert_int_equal(l->rate, 1);
            assert_int_equal(l->per_group, 7);
        } else {
            assert_string_equal(l->type, "both"); /* the file's per_group, the flag's concurrency */
            assert_int_equal(l->per_group, 4);
            assert_int_equal(l->concurrency, 1);
            assert_int_equal(l->source, DSP_LIMIT_FLAG);
        }
    }
    dsp_config_free(&c);
    static const char *const bad[] = {"g", "g:", ":2", "g:x", "g:-1", "g:1000001", "g:2,3", "g:per_group=2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--group-limit", bad[i], NULL),
                         DSP_CONFIG_BAD);
        assert_non_null(strstr(err, "--group-limit"));
        dsp_config_free(&c);
    }
    assert_int_equal(load(&c, err, sizeof err, "--db", "mysql://u@h/d", "--type-limit", "g:per_group=1000001", NULL),
                     DSP_CONFIG_BAD);
    dsp_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults_match_spec, setup),
        cmocka_unit_test_setup(test_db_is_required, setup),
        cmocka_unit_test_setup(test_bad_flags_are_refused, setup),
        cmocka_unit_test_setup(test_hostport_rules, setup),
        cmocka_unit_test(test_hostport_format),
        cmocka_unit_test_setup(test_lease_flags, setup),
        cmocka_unit_test_setup(test_sql_dialect, setup),
        cmocka_unit_test_setup(test_wake, setup),
        cmocka_unit_test_setup(test_migrate_flag, setup),
        cmocka_unit_test_setup(test_help_and_version_exit_zero, setup),
        cmocka_unit_test_setup(test_flags_override_config_file_and_env, setup),
        cmocka_unit_test_setup(test_group_limits, setup),
        cmocka_unit_test_setup(test_config_file_unknown_key, setup),
        cmocka_unit_test_setup(test_url_tcp_with_password_and_port, setup),
        cmocka_unit_test_setup(test_url_socket_only_without_port, setup),
        cmocka_unit_test_setup(test_url_node_list, setup),
        cmocka_unit_test_setup(test_url_rejects_malformed, setup),
        cmocka_unit_test_setup(test_url_ipv6_host, setup),
        cmocka_unit_test_setup(test_config_file_long_line, setup),
        cmocka_unit_test_setup(test_password_from_environment, setup),
        cmocka_unit_test_setup(test_token_file_and_env, setup),
        cmocka_unit_test_setup(test_admin_token_file_and_env, setup),
        cmocka_unit_test_setup(test_settings_listing_hides_secrets, setup),
        cmocka_unit_test_setup(test_durations, setup),
        cmocka_unit_test_setup(test_duration_flags, setup),
        cmocka_unit_test_setup(test_type_limits, setup),
        cmocka_unit_test_setup(test_table_flag, setup),
        cmocka_unit_test_setup(test_no_abbreviations, setup),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
