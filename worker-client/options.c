/* options.c: option defaults and validation, the address list, error texts,
 * and the small pure helpers (clock, jitter) the rest of the library uses. */
#include "options.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_CAPACITY 1u
#define DEFAULT_THREADS 0u
#define DEFAULT_RECONNECT_MIN_MS 100u
#define DEFAULT_RECONNECT_MAX_MS 5000u
#define DEFAULT_CONNECT_TIMEOUT_MS 5000u

/* Longest delay any option may ask for: a day, so that ms -> ns never overflows. */
#define MAX_DELAY_MS (24u * 3600u * 1000u)

static const char *const error_texts[] = {
    [-TP_OK] = "success",
    [-TP_EINVAL] = "invalid argument",
    [-TP_ENOMEM] = "out of memory",
    [-TP_ESYS] = "system call failed",
    [-TP_EBUSY] = "worker is running",
    [-TP_EEXIST] = "type already registered",
    [-TP_ERANGE] = "limit exceeded",
    [-TP_ETOOBIG] = "larger than the dispatcher accepts",
    [-TP_EGONE] = "delivery cancelled or connection lost",
    [-TP_EUNAVAIL] = "dispatcher cannot take it now",
    [-TP_ETIMEDOUT] = "timed out",
    [-TP_ENOTSUP] = "not supported by the dispatcher's protocol version",
};

const char *tp_strerror(int code)
{
    const char *s = "unknown error";

    if (code <= 0 && -code < (int)(sizeof(error_texts) / sizeof(error_texts[0])) &&
        error_texts[-code] != NULL)
        s = error_texts[-code];
    return s;
}

const char *tp_version(void)
{
    return TASKPUSH_VERSION;
}

void tp_worker_options_init(tp_worker_options *opts)
{
    if (opts == NULL)
        return;
    memset(opts, 0, sizeof(*opts));
    opts->version = TP_OPTIONS_VERSION;
    opts->capacity = DEFAULT_CAPACITY;
    opts->threads = DEFAULT_THREADS;
    opts->reconnect_min_ms = DEFAULT_RECONNECT_MIN_MS;
    opts->reconnect_max_ms = DEFAULT_RECONNECT_MAX_MS;
    opts->connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS;
    opts->log_level = TP_LOG_INFO;
}

int tpi_error_set(tp_error *err, int code, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL) {
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->text, sizeof(err->text), fmt, ap);
        va_end(ap);
    }
    return code;
}

int tpi_options_copy(const tp_worker_options *in, tp_worker_options *out, tp_error *err)
{
    size_t known;

    if (in == NULL)
        return tpi_error_set(err, TP_EINVAL, "options are NULL");
    if (in->version == 0 || in->version > TP_OPTIONS_VERSION)
        return tpi_error_set(err, TP_EINVAL, "options version %u unknown (use tp_worker_options_init)",
                             in->version);
    /* A caller built against an older header has a shorter struct: read only
     * the fields its version has, the rest keep their defaults. */
    known = in->version >= 3   ? sizeof(*in)
            : in->version == 2 ? offsetof(tp_worker_options, submit_give_up_rounds)
                               : offsetof(tp_worker_options, tls);
    tp_worker_options_init(out);
    memcpy(out, in, known);
    return TP_OK;
}

int tpi_options_check(const tp_worker_options *o, tp_error *err)
{
    int rc = TP_EINVAL;

    if (o == NULL) {
        tpi_error_set(err, rc, "options are NULL");
        goto done;
    }
    if (o->version == 0 || o->version > TP_OPTIONS_VERSION) {
        tpi_error_set(err, rc, "options version %u unknown (use tp_worker_options_init)",
                      o->version);
        goto done;
    }
    if (o->addresses == NULL || o->addresses[0] == '\0') {
        tpi_error_set(err, rc, "no dispatcher address given");
        goto done;
    }
    if (o->name != NULL && (o->name[0] == '\0' || strlen(o->name) > TP_MAX_NAME_LEN)) {
        tpi_error_set(err, rc, "name must be 1 to %u bytes", TP_MAX_NAME_LEN);
        goto done;
    }
    if (o->token != NULL && strlen(o->token) > TP_MAX_TOKEN_LEN) {
        tpi_error_set(err, rc, "token longer than %u bytes", TP_MAX_TOKEN_LEN);
        goto done;
    }
    if (o->capacity < 1 || o->capacity > TP_MAX_CAPACITY) {
        tpi_error_set(err, rc, "capacity %u outside 1..%u", o->capacity, TP_MAX_CAPACITY);
        goto done;
    }
    if (o->threads > TP_MAX_THREADS) {
        tpi_error_set(err, rc, "threads %u outside 0..%u", o->threads, TP_MAX_THREADS);
        goto done;
    }
    if (o->reconnect_min_ms < 1 || o->reconnect_min_ms > MAX_DELAY_MS ||
        o->reconnect_max_ms < o->reconnect_min_ms || o->reconnect_max_ms > MAX_DELAY_MS) {
        tpi_error_set(err, rc, "reconnect delays must satisfy 1 <= min (%u) <= max (%u) <= %u",
                      o->reconnect_min_ms, o->reconnect_max_ms, MAX_DELAY_MS);
        goto done;
    }
    if (o->connect_timeout_ms < 1 || o->connect_timeout_ms > MAX_DELAY_MS) {
        tpi_error_set(err, rc, "connect timeout %u outside 1..%u ms", o->connect_timeout_ms,
                      MAX_DELAY_MS);
        goto done;
    }
    if (!o->tls && (o->tls_ca_file != NULL || o->tls_cert_file != NULL || o->tls_key_file != NULL)) {
        tpi_error_set(err, rc, "tls_ca_file, tls_cert_file and tls_key_file need tls");
        goto done;
    }
    if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL)) {
        tpi_error_set(err, rc, "tls_cert_file and tls_key_file go together");
        goto done;
    }
    if (o->log_level < TP_LOG_ERROR || o->log_level > TP_LOG_DEBUG) {
        tpi_error_set(err, rc, "log level %d outside %d..%d", o->log_level, TP_LOG_ERROR,
                      TP_LOG_DEBUG);
        goto done;
    }
    rc = TP_OK;
done:
    return rc;
}

/* parse_port reads a decimal port 1..65535 from s[0..len) into out. */
static int parse_port(const char *s, size_t len, char out[6])
{
    unsigned long v = 0;

    if (len == 0 || len > 5)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v < 1 || v > 65535)
        return -1;
    snprintf(out, 6, "%lu", v);
    return 0;
}

/* parse_one parses one entry s[0..len) (already trimmed) into *a. */
static int parse_one(const char *s, size_t len, tpi_addr *a, tp_error *err)
{
    int rc = TP_EINVAL;
    const char *host;
    size_t hlen;
    const char *colon;

    /* Say what is wrong with the usual mistakes, before the split below misreads them. */
    for (size_t i = 0; i + 2 < len; i++) {
        if (s[i] == ':' && s[i + 1] == '/' && s[i + 2] == '/') {
            tpi_error_set(err, rc, "address '%.*s': no scheme such as http:// (give HOST:PORT)",
                          (int)len, s);
            goto done;
        }
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '/' || s[i] == '?' || s[i] == '#' || s[i] == '@') {
            tpi_error_set(err, rc, "address '%.*s': no path or user name (give HOST:PORT)",
                          (int)len, s);
            goto done;
        }
    }
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);

        if (close == NULL || close + 1 >= s + len || close[1] != ':') {
            tpi_error_set(err, rc, "address '%.*s': expected [IPV6]:PORT", (int)len, s);
            goto done;
        }
        host = s + 1;
        hlen = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = NULL;
        for (size_t i = len; i > 0; i--) {
            if (s[i - 1] == ':') {
                colon = s + i - 1;
                break;
            }
        }
        if (colon == NULL) {
            tpi_error_set(err, rc, "address '%.*s': no port (give HOST:PORT)", (int)len, s);
            goto done;
        }
        host = s;
        hlen = (size_t)(colon - s);
        if (memchr(host, ':', hlen) != NULL) {
            tpi_error_set(err, rc, "address '%.*s': write an IPv6 address as [ADDR]:PORT", (int)len,
                          s);
            goto done;
        }
    }
    if (hlen == 0) {
        tpi_error_set(err, rc, "address '%.*s': the host is empty", (int)len, s);
        goto done;
    }
    if (hlen >= sizeof(a->host) || memchr(host, '\0', hlen) != NULL) {
        tpi_error_set(err, rc, "address '%.*s': bad host", (int)len, s);
        goto done;
    }
    if (parse_port(colon + 1, (size_t)(s + len - colon - 1), a->port) < 0) {
        tpi_error_set(err, rc, "address '%.*s': the port must be a number from 1 to 65535", (int)len, s);
        goto done;
    }
    memcpy(a->host, host, hlen);
    a->host[hlen] = '\0';
    rc = TP_OK;
done:
    return rc;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t';
}

int tpi_addr_parse(const char *list, tpi_addr **out, size_t *n, tp_error *err)
{
    int rc = TP_EINVAL;
    tpi_addr *addrs = NULL;
    size_t count = 0;
    const char *p = list;

    if (list == NULL || out == NULL || n == NULL) {
        tpi_error_set(err, rc, "no address list");
        goto done;
    }
    addrs = calloc(TP_MAX_ADDRESSES, sizeof(*addrs));
    if (addrs == NULL) {
        rc = tpi_error_set(err, TP_ENOMEM, "out of memory");
        goto done;
    }
    for (;;) {
        const char *end = strchr(p, ',');
        const char *stop = end != NULL ? end : p + strlen(p);
        const char *b = p;
        const char *e = stop;

        while (b < e && is_space(*b))
            b++;
        while (e > b && is_space(e[-1]))
            e--;
        if (b == e) {
            tpi_error_set(err, rc, "empty entry in address list '%s'", list);
            goto done;
        }
        if (count == TP_MAX_ADDRESSES) {
            tpi_error_set(err, rc, "more than %u addresses", TP_MAX_ADDRESSES);
            goto done;
        }
        rc = parse_one(b, (size_t)(e - b), &addrs[count], err);
        if (rc < 0)
            goto done;
        rc = TP_EINVAL;
        count++;
        if (end == NULL)
            break;
        p = end + 1;
    }
    *out = addrs;
    *n = count;
    addrs = NULL;
    rc = TP_OK;
done:
    free(addrs);
    return rc;
}

uint64_t tpi_rand(uint64_t *state)
{
    uint64_t x = *state;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * UINT64_C(2685821657736338717);
}

uint32_t tpi_backoff_ms(uint64_t *rng, uint32_t min, uint32_t max, unsigned failures)
{
    uint64_t d = min;
    uint64_t half;

    for (unsigned i = 0; i < failures && d < max; i++)
        d *= 2;
    if (d > max)
        d = max;
    half = d / 2;
    return (uint32_t)(d - half + tpi_rand(rng) % (half + 1));
}

int64_t tpi_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
