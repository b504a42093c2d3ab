/* test_client_options.c: libtaskpush without a peer: option validation, the
 * address list, the backoff, and the API's argument checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_harness.h"
#include "internal.h"
#include "options.h"
#include "taskpush.h"

static void test_options_defaults(void **state)
{
    tp_worker_options o;
    tp_worker *w;
    tp_error err;

    (void)state;
    memset(&o, 0xAB, sizeof(o));
    tp_worker_options_init(&o);
    assert_int_equal(o.version, TP_OPTIONS_VERSION);
    assert_int_equal(o.capacity, 1);
    assert_int_equal(o.threads, 0);
    assert_true(o.reconnect_min_ms >= 1 && o.reconnect_min_ms <= o.reconnect_max_ms);
    assert_true(o.connect_timeout_ms > 0);
    assert_int_equal(o.log_level, TP_LOG_INFO);
    assert_null(o.addresses);
    assert_null(o.name);
    assert_null(o.token);
    assert_null(o.log);

    o.addresses = "localhost:7070";
    w = tp_worker_new(&o, &err);
    assert_non_null(w);
    assert_int_equal(err.code, TP_OK);
    tp_worker_free(w);
    tp_worker_free(NULL);
}

static void expect_bad_options(const tp_worker_options *o, const char *needle)
{
    tp_error err;
    tp_worker *w = tp_worker_new(o, &err);

    if (w != NULL) {
        tp_worker_free(w);
        fail_msg("options accepted, expected a complaint about '%s'", needle);
    }
    assert_int_equal(err.code, TP_EINVAL);
    if (strstr(err.text, needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", err.text, needle);
}

static void test_options_invalid(void **state)
{
    tp_worker_options o;
    char long_name[TP_MAX_NAME_LEN + 2];
    char long_token[TP_MAX_TOKEN_LEN + 2];

    (void)state;
    expect_bad_options(NULL, "NULL");
    memset(&o, 0, sizeof(o));
    o.addresses = "h:1";
    expect_bad_options(&o, "version");

#define BAD(field, value, needle)                                                                  \
    do {                                                                                           \
        tp_worker_options_init(&o);                                                                \
        o.addresses = "h:1";                                                                       \
        o.field = value;                                                                           \
        expect_bad_options(&o, needle);                                                            \
    } while (0)
    BAD(addresses, NULL, "address");
    BAD(addresses, "", "address");
    BAD(addresses, "nohostport", "HOST:PORT");
    BAD(capacity, 0, "capacity");
    BAD(capacity, TP_MAX_CAPACITY + 1, "capacity");
    BAD(threads, TP_MAX_THREADS + 1, "threads");
    BAD(reconnect_min_ms, 0, "reconnect");
    BAD(reconnect_max_ms, 50, "reconnect"); /* below the default min of 100 */
    BAD(connect_timeout_ms, 0, "timeout");
    BAD(log_level, 7, "log level");
    BAD(name, "", "name");
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    BAD(name, long_name, "name");
    memset(long_token, 't', sizeof(long_token) - 1);
    long_token[sizeof(long_token) - 1] = '\0';
    BAD(token, long_token, "token");
#undef BAD
    /* The error struct is optional. */
    tp_worker_options_init(&o);
    assert_null(tp_worker_new(&o, NULL));
}

/* Options of version 1 (built against the header before TLS): the library
 * reads no byte past log_arg (a heap block of exactly that size, so ASan sees
 * an over-read), and TLS stays off. */
static void test_options_version1(void **state)
{
    size_t v1 = offsetof(tp_worker_options, tls);
    tp_worker_options full;
    tp_worker_options *o = malloc(v1);
    tp_worker *w;
    tp_error err;

    (void)state;
    assert_non_null(o);
    tp_worker_options_init(&full);
    full.version = 1;
    full.addresses = "127.0.0.1:7070";
    memcpy(o, &full, v1);
    w = tp_worker_new(o, &err);
    free(o);
    if (w == NULL)
        fail_msg("version 1 options refused: %s", err.text);
    assert_null(w->tls_ctx);
    assert_int_equal(w->opts.tls, 0);
    tp_worker_free(w);
}

/* Options of version 2 (built against the header before submit_give_up_rounds): read
 * up to the TLS fields only (a block of exactly that size: ASan sees an over-read),
 * and submissions wait for a connection as before. */
static void test_options_version2(void **state)
{
    size_t v2 = offsetof(tp_worker_options, submit_give_up_rounds);
    tp_worker_options full;
    tp_worker_options *o = malloc(v2);
    tp_worker *w;
    tp_error err;

    (void)state;
    assert_non_null(o);
    tp_worker_options_init(&full);
    assert_int_equal(full.submit_give_up_rounds, 0);
    full.version = 2;
    full.addresses = "127.0.0.1:7070";
    memcpy(o, &full, v2);
    w = tp_worker_new(o, &err);
    free(o);
    if (w == NULL)
        fail_msg("version 2 options refused: %s", err.text);
    assert_int_equal(w->opts.submit_give_up_rounds, 0);
    tp_worker_free(w);
}

/* TLS options: files named only with tls, certificate and key together, and
 * a file that cannot be read is an error of tp_worker_new (not a retry loop). */
static void test_options_tls(void **state)
{
    tp_worker_options o;
    tp_worker *w;
    tp_error err;
    char junk[256];
    int fd;

    (void)state;
    /* A readable file that is no PEM. */
    snprintf(junk, sizeof(junk), "%s/test_client_junk_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    fd = mkstemp(junk);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a certificate\n", 18), 18);
    close(fd);
#define BAD_TLS(tls_on, ca, cert, key, needle)                                                         do {                                                                                                   tp_worker_options_init(&o);                                                                        o.addresses = "h:1";                                                                               o.tls = (tls_on);                                                                                  o.tls_ca_file = (ca);                                                                              o.tls_cert_file = (cert);                                                                          o.tls_key_file = (key);                                                                            expect_bad_options(&o, needle);                                                                } while (0)
    BAD_TLS(0, junk, NULL, NULL, "need tls");
    BAD_TLS(1, NULL, junk, NULL, "go together");
    BAD_TLS(1, NULL, NULL, junk, "go together");
    BAD_TLS(1, "/nonexistent/ca.pem", NULL, NULL, "/nonexistent/ca.pem");
    BAD_TLS(1, junk, NULL, NULL, "no usable PEM");
    BAD_TLS(1, NULL, junk, junk, "not a usable PEM certificate");
#undef BAD_TLS
    unlink(junk);
    /* tls alone trusts the system's CAs. */
    tp_worker_options_init(&o);
    o.addresses = "h:1";
    o.tls = 1;
    w = tp_worker_new(&o, &err);
    if (w == NULL)
        fail_msg("tls with the system's CAs refused: %s", err.text);
    assert_non_null(w->tls_ctx);
    tp_worker_free(w);
}

static void test_addr_parse_valid(void **state)
{
    tpi_addr *a = NULL;
    size_t n = 0;
    tp_error err;

    (void)state;
    assert_int_equal(tpi_addr_parse("127.0.0.1:7070", &a, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(a[0].host, "127.0.0.1");
    assert_string_equal(a[0].port, "7070");
    free(a);

    assert_int_equal(tpi_addr_parse("db1.example:1, [::1]:65535 ,host-2:08", &a, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_string_equal(a[0].host, "db1.example");
    assert_string_equal(a[0].port, "1");
    assert_string_equal(a[1].host, "::1");
    assert_string_equal(a[1].port, "65535");
    assert_string_equal(a[2].host, "host-2");
    assert_string_equal(a[2].port, "8");
    free(a);
}

static void test_addr_parse_invalid(void **state)
{
    static const char *const bad[] = {
        "",          "host",    "host:",  ":80",     "host:0",      "host:65536",
        "host:12ab", "host:-1", "::1:80", "[::1]80", "[::1]",       "[]:80",
        "a:1,,b:2",  "a:1,",    ",a:1",   " , ",     "host:123456",
    };
    char many[TP_MAX_ADDRESSES * 8 + 16] = "";

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tpi_addr *a = NULL;
        size_t n = 0;
        tp_error err = {0, ""};

        if (tpi_addr_parse(bad[i], &a, &n, &err) != TP_EINVAL) {
            free(a);
            fail_msg("address list '%s' was accepted", bad[i]);
        }
        assert_int_equal(err.code, TP_EINVAL);
        assert_true(err.text[0] != '\0');
        assert_null(a);
    }
    for (unsigned i = 0; i <= TP_MAX_ADDRESSES; i++)
        strcat(many, i == 0 ? "h:1" : ",h:1");
    {
        tpi_addr *a = NULL;
        size_t n = 0;

        assert_int_equal(tpi_addr_parse(many, &a, &n, NULL), TP_EINVAL);
        assert_null(a);
    }
}


/* Each usual mistake is named, not reported as another one (an http:// URL was
 * once answered "write an IPv6 address as [ADDR]:PORT"). */
static void test_addr_parse_reasons(void **state)
{
    static const struct {
        const char *in, *says;
    } cases[] = {
        {"http://127.0.0.1:7070", "no scheme such as http://"},
        {"tcp://h:1", "no scheme"},
        {"127.0.0.1:7070/x", "no path"},
        {"u@h:1", "user name"},
        {"127.0.0.1:99999", "port must be a number from 1 to 65535"},
        {"h:0", "from 1 to 65535"},
        {":7070", "the host is empty"},
        {"[]:7070", "the host is empty"},
        {"::1:7070", "write an IPv6 address as [ADDR]:PORT"},
        {"host", "no port"},
        {"[::1]", "expected [IPV6]:PORT"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tpi_addr *a = NULL;
        size_t n = 0;
        tp_error err = {0, ""};

        assert_int_equal(tpi_addr_parse(cases[i].in, &a, &n, &err), TP_EINVAL);
        assert_null(a);
        if (strstr(err.text, cases[i].says) == NULL)
            fail_msg("'%s' gave \"%s\", not \"%s\"", cases[i].in, err.text, cases[i].says);
    }
}


static void test_add_type_and_run_checks(void **state)
{
    tp_worker *w = new_worker("127.0.0.1:1", 1, 0);
    char long_type[TP_MAX_TYPE_LEN + 2];
    char name[16];

    (void)state;
    /* A worker without types is a producer-only client (tp_submit): it runs; stopped
     * before the run, the run returns at once. */
    tp_worker_stop(w);
    assert_int_equal(tp_worker_run(w), 0);
    assert_int_equal(tp_worker_run(NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(NULL, "a", noop_handler, NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(w, NULL, noop_handler, NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(w, "", noop_handler, NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(w, "a", NULL, NULL), TP_EINVAL);
    memset(long_type, 'x', sizeof(long_type) - 1);
    long_type[sizeof(long_type) - 1] = '\0';
    assert_int_equal(tp_worker_add_type(w, long_type, noop_handler, NULL), TP_ERANGE);
    long_type[TP_MAX_TYPE_LEN] = '\0'; /* exactly the limit */
    assert_int_equal(tp_worker_add_type(w, long_type, noop_handler, NULL), 0);
    assert_int_equal(tp_worker_add_type(w, long_type, noop_handler, NULL), TP_EEXIST);
    for (unsigned i = 1; i < TP_MAX_TYPES; i++) {
        snprintf(name, sizeof(name), "t%u", i);
        assert_int_equal(tp_worker_add_type(w, name, noop_handler, NULL), 0);
    }
    assert_int_equal(tp_worker_add_type(w, "one-too-many", noop_handler, NULL), TP_ERANGE);
    assert_int_equal(tp_worker_get_stats(w, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_worker_get_stats(NULL, NULL, 0), TP_EINVAL);
    tp_worker_free(w);
}

static void test_strerror_and_version(void **state)
{
    static const int codes[] = {TP_OK,     TP_EINVAL, TP_ENOMEM,  TP_ESYS, TP_EBUSY,
                                TP_EEXIST, TP_ERANGE, TP_ETOOBIG, TP_EGONE};

    (void)state;
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        const char *s = tp_strerror(codes[i]);

        assert_non_null(s);
        assert_string_not_equal(s, "unknown error");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, tp_strerror(codes[j]));
    }
    assert_string_equal(tp_strerror(-1000), "unknown error");
    assert_string_equal(tp_strerror(5), "unknown error");
    assert_string_equal(tp_version(), TASKPUSH_VERSION);
}

static void test_backoff(void **state)
{
    uint64_t rng = 12345;

    (void)state;
    for (int round = 0; round < 200; round++) {
        for (unsigned failures = 0; failures < 40; failures++) {
            uint64_t full = 100;
            uint32_t d;

            for (unsigned i = 0; i < failures && full < 5000; i++)
                full *= 2;
            if (full > 5000)
                full = 5000;
            d = tpi_backoff_ms(&rng, 100, 5000, failures);
            assert_true(d >= full - full / 2 && d <= full);
        }
    }
    /* The jitter really varies. */
    {
        uint32_t first = tpi_backoff_ms(&rng, 1000, 1000, 0);
        int differs = 0;

        for (int i = 0; i < 50 && !differs; i++)
            differs = tpi_backoff_ms(&rng, 1000, 1000, 0) != first;
        assert_true(differs);
    }
    assert_true(tpi_backoff_ms(&rng, 1, 1, 0) == 1);
}

static void test_stop_before_run(void **state)
{
    tp_worker *w = new_worker("127.0.0.1:1", 1, 2);

    (void)state;
    assert_int_equal(tp_worker_add_type(w, "a", noop_handler, NULL), 0);
    tp_worker_stop(w);
    assert_int_equal(tp_worker_run(w), 0);
    assert_int_equal(stats_of(w).connect_attempts, 0);
    tp_worker_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_defaults),
        cmocka_unit_test(test_options_invalid),
        cmocka_unit_test(test_options_version1),
        cmocka_unit_test(test_options_version2),
        cmocka_unit_test(test_options_tls),
        cmocka_unit_test(test_addr_parse_valid),
        cmocka_unit_test(test_addr_parse_invalid),
        cmocka_unit_test(test_addr_parse_reasons),
        cmocka_unit_test(test_add_type_and_run_checks),
        cmocka_unit_test(test_strerror_and_version),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_stop_before_run),
    };

    if (getenv("TP_TEST_FILTER") != NULL) /* e.g. TP_TEST_FILTER='test_exec*' */
        cmocka_set_test_filter(getenv("TP_TEST_FILTER"));
    return cmocka_run_group_tests_name("client-options", tests, NULL, NULL);
}
