#include "config.h"
#include "db.h"
#include "tables.h"

#include "utf8.h"
#include "log.h"
#include "proto.h"
#include "tls.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* OPT_MS: a duration flag named ...-ms (docs/taskpushd.md, "Durations"): a plain number
 * is milliseconds, and 30s, 5m, ... are accepted too; min and max are in ms.
 * OPT_DURATION: the same, and "keep" (0). */
enum opt_kind { OPT_STRING, OPT_INT, OPT_DURATION, OPT_HOSTPORT, OPT_SCHED, OPT_LOGLEVEL, OPT_TYPE_LIMIT,
                OPT_GROUP_LIMIT,
                OPT_DIALECT, OPT_MS, OPT_WAKE };

typedef struct opt_def {
    const char *name;
    int kind;
    size_t offset;
    const char *def; /* default as text; NULL = unset */
    int64_t min, max;
    const char *metavar;
    const char *help;
} opt_def;

#define F(field) offsetof(dsp_config, field)

/* The one list of settings: flags, config-file keys and /stats all come from it. */
static const opt_def option_table[] = {
    {"db", OPT_STRING, F(db), NULL, 0, 0, "URL",
     "mysql://USER[:PASSWORD]@HOST[:PORT]/DB[?socket=PATH] (or TASKPUSH_DB)"},
    {"listen", OPT_HOSTPORT, F(listen), "127.0.0.1:7070", 0, 0, "HOST:PORT", "where workers connect"},
    {"admin", OPT_HOSTPORT, F(admin), "127.0.0.1:7071", 0, 0, "HOST:PORT", "admin HTTP port"},
    {"scheduler", OPT_SCHED, F(scheduler), "least-loaded", 0, 0, "POLICY",
     "round-robin or least-loaded"},
    {"batch", OPT_INT, F(batch), "2000", 1, 10000, "N", "most tasks claimed per transaction"},
    {"poll-ms", OPT_MS, F(poll_ms), "100", 1, 3600000, "MS", "longest idle wait between polls"},
    {"task-timeout-ms", OPT_MS, F(task_timeout_ms), "60000", 1, INT32_MAX, "MS",
     "default execution limit of a task"},
    {"prefetch", OPT_INT, F(prefetch), "2000", 0, 1000000, "N",
     "claimed tasks kept ready beyond the workers' free slots"},
    {"prefetch-ms", OPT_MS, F(prefetch_ms), "250", 0, 60000, "MS",
     "claim ahead about what the workers finish in this long, within --prefetch; 0: all of --prefetch"},
    {"claim-split", OPT_INT, F(claim_split), "0", 0, 10000, "N",
     "a claim of N rows or more is split over two connections; 0: never"},
    {"max-buffered-bytes", OPT_INT, F(max_buffered_bytes), "67108864", 65536, (int64_t)1 << 40, "BYTES",
     "payload bytes of the tasks taskpushd holds (buffered and in flight); claims stop at it,"
     " a claim always takes one task"},
    {"heartbeat-ms", OPT_MS, F(heartbeat_ms), "1000", 10, 3600000, "MS",
     "heartbeat interval; a peer silent for 3 intervals is lost"},
    {"shutdown-grace-ms", OPT_MS, F(shutdown_grace_ms), "10000", 0, 3600000, "MS",
     "on SIGTERM, how long in-flight tasks may finish"},
    {"result-flush-ms", OPT_MS, F(result_flush_ms), "50", 0, 10000, "MS",
     "longest a result waits to be written with others"},
    {"max-frame", OPT_INT, F(max_frame), NULL, 64, INT32_MAX, "BYTES",
     "largest frame body accepted from a worker"},
    {"max-capacity", OPT_INT, F(max_capacity), "1024", 1, 65536, "N",
     "most deliveries one worker may hold at once; a larger HELLO capacity is cut to it"},
    {"max-connections", OPT_INT, F(max_connections), "10000", 1, 1000000, "N",
     "most worker connections at once; more are closed on accept"},
    {"max-conn-output-bytes", OPT_INT, F(max_conn_output_bytes), "67108864", 65536, INT64_C(1) << 40,
     "BYTES", "a peer with more than this waiting to be sent to it (beyond one frame) is closed as stalled"},
    {"max-submit-bytes", OPT_INT, F(max_submit_bytes), "268435456", 65536, INT64_C(1) << 40, "BYTES",
     "submissions read but not yet committed, all connections together; beyond, reading waits"},
    {"admin-max-connections", OPT_INT, F(admin_max_connections), "128", 2, 100000, "N",
     "most admin HTTP connections at once; a new one closes the oldest that has no request pending"},
    {"admin-request-timeout-ms", OPT_MS, F(admin_request_timeout_ms), "30000", 100, 3600000, "MS",
     "an admin connection that has not sent a whole request this long after it opened (or after"
     " its last answer) is closed, however slowly it trickles bytes"},
    {"max-failed-handshakes", OPT_INT, F(max_failed_handshakes), "200", 0, 1000000, "N",
     "connections closed before HELLO was accepted, per second, beyond which accepting pauses; 0: no limit"},
    {"max-types-per-worker", OPT_INT, F(max_types_per_worker), "64", 1, PROTO_MAX_TYPES, "N",
     "most task types one worker may register"},
    {"max-types", OPT_INT, F(max_types), "10000", 1, 1000000, "N",
     "most distinct task types registered by all workers together"},
    {"max-timeouts", OPT_INT, F(max_timeouts), "3", 1, 1000, "N",
     "a worker whose deliveries time out this many times in a row is disconnected"},
    {"max-unwritten", OPT_INT, F(max_unwritten), "8000", 1, 1000000, "N",
     "no new delivery while more outcomes than this wait to be written"},
    {"max-unwritten-bytes", OPT_INT, F(max_unwritten_bytes), "268435456", 1048576, INT64_C(1) << 40, "BYTES",
     "no new delivery while the outcomes waiting to be written hold more result and error bytes than this"},
    {"adopt-grace-ms", OPT_MS, F(adopt_grace_ms), "3000", 0, 600000, "MS",
     "a new leader recovers rows of older epochs only this long after it starts leading, so"
     " that workers can declare what they still run (0: at once)"},
    {"orphan-grace-ms", OPT_MS, F(orphan_grace_ms), "5000", 0, 3600000, "MS",
     "buffered tasks of a type that lost its last worker go back to NEW after this"},
    {"retry-backoff-ms", OPT_MS, F(retry_backoff_ms), "1000", 1, 86400000, "MS",
     "delay before the first retry of a failed attempt; doubles per attempt, with jitter"},
    {"retry-backoff-max-ms", OPT_MS, F(retry_backoff_max_ms), "300000", 1, 86400000, "MS",
     "longest retry delay"},
    {"retain-finished", OPT_DURATION, F(retain_finished_ms), "keep", 0, 0, "DURATION",
     "delete SUCCESSFUL rows older than this (e.g. 7d, 12h); keep = never"},
    {"retain-failed", OPT_DURATION, F(retain_failed_ms), "keep", 0, 0, "DURATION",
     "delete FAILED rows older than this; keep = never"},
    {"table-stats-ms", OPT_MS, F(table_stats_ms), "2000", 100, 3600000, "MS",
     "how often the table-side figures (counts, queue lag) are read"},
    /* No default here: the database threads pick one for the server (db.h). */
    {"lease-ms", OPT_MS, F(lease_ms), NULL, 100, 600000, "MS",
     "the leadership lease: a standby takes over this long after the leader's last renewal"
     " (default 1000; 5000 on a Galera cluster)"},
    {"lease-renew-ms", OPT_MS, F(lease_renew_ms), NULL, 10, 300000, "MS",
     "how often the leader renews its lease, at most half of --lease-ms (default 250; 1000 on"
     " a Galera cluster)"},
    {"sql-dialect", OPT_DIALECT, F(sql_dialect), "auto", 0, 0, "DIALECT",
     "auto, mysql or mariadb: the SQL sent (mysql: only what MySQL >= 8.0.13 accepts);"
     " auto reads the server's version at each connect"},
    {"wake", OPT_WAKE, F(wake), "auto", 0, 0, "auto|binlog|poll",
     "how rows inserted by SQL are noticed: binlog follows the server's binary log (auto: when"
     " in ROW format and the user may replicate); polling at --poll-ms goes on in every mode"},
    {"type-limit", OPT_TYPE_LIMIT, F(type_limits), NULL, 0, 0, "T:concurrency=N,rate=R,per_group=G",
     "at most N tasks of type T running at once, at most R started a second, at most G running"
     " per group_key (repeatable; 0: no limit)"},
    {"group-limit", OPT_GROUP_LIMIT, F(type_limits), NULL, 0, 0, "T:N",
     "at most N tasks of type T running at once per group_key, over all workers (repeatable;"
     " the same as --type-limit T:per_group=N)"},
    {"table", OPT_STRING, F(table), DSP_TABLE_NAME_DEFAULT, 0, 0, "NAME",
     "the task table; taskpush's other tables are NAME_meta, NAME_schedule, NAME_claim, NAME_setting,"
     " NAME_progress and NAME_dep (for task: taskpush_meta, task_schedule, task_claim, task_setting,"
     " task_progress, task_dep), so queues can share a database"},
    {"types", OPT_STRING, F(types), NULL, 0, 0, "T1,T2",
     "own only these task types (a shard with its own lease and standbys); default: all"},
    {"shard", OPT_STRING, F(shard), NULL, 0, 0, "NAME",
     "the shard's name in taskpush_meta (needs --types; default: derived from the types)"},
    {"ready-file", OPT_STRING, F(ready_file), NULL, 0, 0, "PATH",
     "write {pid, listen, admin} as JSON here once the ports are open (for scripts)"},
    {"token-file", OPT_STRING, F(token_file), NULL, 0, 0, "PATH",
     "workers must present this secret (also TASKPUSH_TOKEN)"},
    {"tls-cert", OPT_STRING, F(tls_cert), NULL, 0, 0, "PEM",
     "serve both ports over TLS with this certificate chain (needs --tls-key)"},
    {"tls-key", OPT_STRING, F(tls_key), NULL, 0, 0, "PEM", "the private key of --tls-cert"},
    {"tls-ca", OPT_STRING, F(tls_ca), NULL, 0, 0, "PEM",
     "workers must present a certificate signed by this CA (the admin port asks none)"},
    {"admin-token-file", OPT_STRING, F(admin_token_file), NULL, 0, 0, "PATH",
     "admin POSTs need this bearer token (also TASKPUSH_ADMIN_TOKEN; default: the worker token)"},
    {"log-level", OPT_LOGLEVEL, F(log_level), "info", 0, 0, "LEVEL", "error, warn, info or debug"},
    {"config", OPT_STRING, F(config_file), NULL, 0, 0, "PATH", "a file of KEY = VALUE lines"},
};
#define NOPTIONS (sizeof option_table / sizeof option_table[0])
#undef F

enum { OPT_HELP = 'h', OPT_VERSION = 'V', OPT_MIGRATE = 'M', OPT_TABLE_BASE = 256 };

const char *dsp_sched_policy_name(int policy)
{
    return policy == DSP_SCHED_ROUND_ROBIN ? "round-robin" : "least-loaded";
}

static void usage(FILE *out)
{
    fprintf(out, "Usage: taskpushd --db URL [OPTION]...\n"
                 "Claims NEW tasks from a MySQL/MariaDB table in batches and pushes them to workers.\n\n");
    for (size_t i = 0; i < NOPTIONS; i++) {
        const opt_def *o = &option_table[i];
        char left[64];
        snprintf(left, sizeof left, "--%s %s", o->name, o->metavar);
        fprintf(out, "  %-26s %s", left, o->help);
        if (o->def)
            fprintf(out, " (default %s)", o->def);
        fputc('\n', out);
    }
    fprintf(out, "  %-26s %s\n  %-26s %s\n", "-h, --help", "show this help and exit", "--version",
            "show the version and exit");
    /* An action, not a setting: no config-file key, not in the option table. */
    fprintf(out, "  %-26s %s\n", "--migrate",
            "upgrade the schema (sql/migrations), then exit");
}

/* Writes why (when wanted) and fails: dsp_hostport_split's one exit for a bad address. */
static int hostport_bad(char *why, size_t whylen, const char *text)
{
    if (why && whylen)
        snprintf(why, whylen, "%s", text);
    return -1;
}

int dsp_hostport_split(const char *s, char *host, size_t hostlen, unsigned *port, char *why,
                       size_t whylen)
{
    if (strstr(s, "://"))
        return hostport_bad(why, whylen, "no scheme such as http:// (give HOST:PORT)");
    if (s[strcspn(s, "/?#@")])
        return hostport_bad(why, whylen, "no path or user name (give HOST:PORT)");
    const char *colon = strrchr(s, ':');
    if (!colon)
        return hostport_bad(why, whylen, "no port (give HOST:PORT)");
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (h[0] == '[') { /* [v6]:port */
        if (hl < 2 || h[hl - 1] != ']' || memchr(h + 1, ']', hl - 2))
            return hostport_bad(why, whylen, "an IPv6 address is written [ADDR]:PORT");
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl)) {
        return hostport_bad(why, whylen, "write an IPv6 address as [ADDR]:PORT");
    }
    if (hl == 0)
        return hostport_bad(why, whylen, "the host is empty");
    if (hl + 1 > hostlen || strcspn(h, " \t\r\n") < hl)
        return hostport_bad(why, whylen, "the host is too long or has white space");
    /* Digits only: strtol would also take "+80" or " 80". */
    const char *ps = colon + 1;
    size_t pl = strlen(ps);
    unsigned long p = 0;
    for (size_t i = 0; i < pl && p <= 65535; i++)
        p = ps[i] >= '0' && ps[i] <= '9' ? p * 10 + (unsigned long)(ps[i] - '0') : 65536;
    if (pl == 0 || p > 65535)
        return hostport_bad(why, whylen, "the port is not a number from 0 to 65535");
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (unsigned)p;
    return 0;
}

int dsp_hostport_parse(const char *s, char *host, size_t hostlen, unsigned *port)
{
    return dsp_hostport_split(s, host, hostlen, port, NULL, 0);
}

void dsp_hostport_format(char *out, size_t outlen, const char *host, unsigned port)
{
    bool v6 = strchr(host, ':') != NULL;
    snprintf(out, outlen, "%s%s%s:%u", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

static char *dup_range(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

void dsp_db_url_clear(dsp_db_url *u)
{
    free(u->user);
    free(u->password);
    for (size_t i = 0; i < u->nnodes; i++)
        free(u->nodes[i].host);
    free(u->socket);
    free(u->dbname);
    memset(u, 0, sizeof *u);
}

/* One HOST[:PORT] or [V6][:PORT] of the URL's server list (len bytes at s). */
static int node_parse(const char *s, size_t len, dsp_db_node *out, char *err, size_t errlen)
{
    char hostport[256], hostbuf[256];
    unsigned port = 0;

    if (len == 0 || len >= sizeof hostport) {
        snprintf(err, errlen, len ? "database URL has a host of more than 255 bytes" : "database URL has no host");
        return -1;
    }
    memcpy(hostport, s, len);
    hostport[len] = '\0';
    /* The brackets are not part of the host, and a host with a colon (IPv6) must be in
     * them. */
    const char *rb = hostport[0] == '[' ? strchr(hostport, ']') : NULL;
    if (hostport[0] == '[' && (!rb || rb == hostport + 1 || (rb[1] && rb[1] != ':') ||
                               strchr(hostport + 1, '['))) {
        snprintf(err, errlen, "database URL has a bad host '%s'", hostport);
        return -1;
    }
    if (rb ? rb[1] == ':' : strchr(hostport, ':') != NULL) {
        if (dsp_hostport_parse(hostport, hostbuf, sizeof hostbuf, &port) < 0 || port == 0) {
            snprintf(err, errlen, "database URL has a bad port in '%s'", hostport);
            return -1;
        }
        if (!rb && strchr(hostbuf, ':')) {
            snprintf(err, errlen, "database URL: put an IPv6 host in brackets, as in [::1]:3306");
            return -1;
        }
        out->host = strdup(hostbuf);
    } else if (rb) {
        out->host = dup_range(hostport + 1, (size_t)(rb - hostport - 1));
    } else {
        out->host = strdup(hostport);
    }
    out->port = port;
    return out->host ? 0 : -1;
}

int dsp_db_url_parse(const char *url, dsp_db_url *out, char *err, size_t errlen)
{
    static const char scheme[] = "mysql://";
    memset(out, 0, sizeof *out);
    if (strncmp(url, scheme, sizeof scheme - 1) != 0) {
        snprintf(err, errlen, "database URL must start with mysql://");
        return -1;
    }
    const char *p = url + sizeof scheme - 1;
    const char *at = strrchr(p, '@');
    const char *slash = at ? strchr(at, '/') : NULL;
    if (!at || !slash) {
        snprintf(err, errlen, "database URL must look like mysql://USER[:PASSWORD]@HOST[:PORT]/DBNAME");
        return -1;
    }
    const char *colon = memchr(p, ':', (size_t)(at - p));
    out->user = dup_range(p, (size_t)((colon ? colon : at) - p));
    if (colon)
        out->password = dup_range(colon + 1, (size_t)(at - colon - 1));

    /* HOST[:PORT] or a list of them, comma-separated: the nodes of one database. */
    const char *h = at + 1;
    while (h < slash) {
        const char *comma = memchr(h, ',', (size_t)(slash - h));
        const char *hend = comma ? comma : slash;
        if (out->nnodes == DSP_DB_NODES_MAX) {
            snprintf(err, errlen, "database URL lists more than %d servers", DSP_DB_NODES_MAX);
            goto bad;
        }
        if (node_parse(h, (size_t)(hend - h), &out->nodes[out->nnodes], err, errlen) < 0)
            goto bad;
        out->nnodes++;
        if (comma && comma + 1 == slash) {
            snprintf(err, errlen, "database URL has an empty server after ','");
            goto bad;
        }
        h = comma ? comma + 1 : slash;
    }
    if (out->nnodes == 0) {
        snprintf(err, errlen, "database URL has no host");
        goto bad;
    }
    out->host = out->nodes[0].host;
    out->port = out->nodes[0].port;
    unsigned port = out->port;

    const char *q = strchr(slash, '?');
    out->dbname = dup_range(slash + 1, (size_t)((q ? q : slash + strlen(slash)) - slash - 1));
    if (!out->dbname[0]) {
        snprintf(err, errlen, "database URL has no database name");
        goto bad;
    }
    for (const char *c = out->dbname; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_' && *c != '$') {
            snprintf(err, errlen, "database name '%s' has characters other than [A-Za-z0-9_$]",
                     out->dbname);
            goto bad;
        }
    if (q) {
        if (strncmp(q + 1, "socket=", 7) != 0 || !q[8]) {
            snprintf(err, errlen, "database URL: the only parameter understood is ?socket=PATH");
            goto bad;
        }
        if (out->nnodes > 1) {
            snprintf(err, errlen, "database URL: ?socket= names one server; a list of servers is reached over TCP");
            goto bad;
        }
        if (!port) /* docs/taskpushd.md: a URL with a port always connects over TCP */
            out->socket = strdup(q + 8);
    }
    if (!out->user[0]) {
        snprintf(err, errlen, "database URL has no user");
        goto bad;
    }
    return 0;
bad:
    dsp_db_url_clear(out);
    return -1;
}

int dsp_duration_ms(const char *s, int64_t *ms)
{
    /* Digits, then a unit or none: no sign, space, fraction or exponent, which strtoll
     * or strtod would take. 19 digits fit an int64_t only below 9.22e18: checked below. */
    size_t nd = strspn(s, "0123456789");
    if (nd == 0 || nd > 19)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < nd; i++)
        v = v * 10 + (uint64_t)(s[i] - '0');
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(s + nd, units[i].unit) == 0) {
            if (v > (uint64_t)(INT64_MAX / units[i].ms))
                return -1;
            *ms = (int64_t)v * units[i].ms;
            return 0;
        }
    return -1;
}

int dsp_duration_parse(const char *s, int64_t *ms)
{
    if (strcmp(s, "keep") == 0) {
        *ms = 0;
        return 0;
    }
    return dsp_duration_ms(s, ms);
}

/* Reads a whole number 0..DSP_LIMIT_MAX, digits only. Returns 0 or -1. */
static int limit_number(const char *s, size_t n, uint32_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 7)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > DSP_LIMIT_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int dsp_type_limit_parse(const char *text, dsp_type_limit *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const char *colon = strrchr(text, ':');
    size_t tl = colon ? (size_t)(colon - text) : 0;
    if (!colon || tl == 0 || tl > PROTO_MAX_TYPE_LEN ||
        dsp_utf8_valid_prefix((const uint8_t *)text, tl) != tl || memchr(text, '\0', tl)) {
        snprintf(err, errlen, "'%.64s' is not T:concurrency=N,rate=R,per_group=G with T 1 to %d bytes of UTF-8",
                 text, PROTO_MAX_TYPE_LEN);
        return -1;
    }
    bool seen[3] = {false, false, false};
    for (const char *p = colon + 1;; p++) {
        size_t n = strcspn(p, ","), kl = strcspn(p, "=,");
        int k = kl == 11 && strncmp(p, "concurrency", 11) == 0 ? 0
                : kl == 4 && strncmp(p, "rate", 4) == 0      ? 1
                : kl == 9 && strncmp(p, "per_group", 9) == 0 ? 2
                                                             : -1;
        uint32_t *field = k == 0 ? &out->concurrency : k == 1 ? &out->rate : &out->per_group;
        if (k < 0 || seen[k] || kl >= n || limit_number(p + kl + 1, n - kl - 1, field) < 0) {
            snprintf(err, errlen,
                     "'%.64s': expected concurrency=N, rate=R and/or per_group=G, each from 0 to %d",
                     text, DSP_LIMIT_MAX);
            return -1;
        }
        seen[k] = true;
        p += n;
        if (!*p)
            break;
    }
    out->per_group_named = seen[2];
    if (!(out->type = dup_range(text, tl))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* "T:N" of --group-limit as "T:per_group=N". */
static int group_limit_parse(const char *text, dsp_type_limit *out, char *err, size_t errlen)
{
    const char *colon = strrchr(text, ':');
    char buf[PROTO_MAX_TYPE_LEN + 40];
    if (!colon || strlen(text) > PROTO_MAX_TYPE_LEN + 20 ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) || !colon[1]) {
        snprintf(err, errlen, "'%.64s' is not T:N (N from 0 to %d)", text, DSP_LIMIT_MAX);
        return -1;
    }
    snprintf(buf, sizeof buf, "%.*s:per_group=%s", (int)(colon - text), text, colon + 1);
    return dsp_type_limit_parse(buf, out, err, errlen);
}

/* One --type-limit (or --group-limit, group true): replaces the entry of its type,
 * else joins the list. A per_group not named keeps the earlier entry's; --group-limit
 * changes only per_group. */
static int add_type_limit(dsp_config *cfg, const char *val, bool group, char *err, size_t errlen)
{
    dsp_type_limit l;
    char inner[400];
    if ((group ? group_limit_parse(val, &l, inner, sizeof inner)
               : dsp_type_limit_parse(val, &l, inner, sizeof inner)) < 0) {
        snprintf(err, errlen, "--%s: %s", group ? "group-limit" : "type-limit", inner);
        return -1;
    }
    l.source = cfg->limit_source;
    for (size_t i = 0; i < cfg->ntype_limits; i++)
        if (strcmp(cfg->type_limits[i].type, l.type) == 0) {
            if (group) {
                cfg->type_limits[i].per_group = l.per_group;
                cfg->type_limits[i].source = l.source;
                free(l.type);
                return 0;
            }
            if (!l.per_group_named)
                l.per_group = cfg->type_limits[i].per_group;
            free(cfg->type_limits[i].type);
            cfg->type_limits[i] = l;
            return 0;
        }
    dsp_type_limit *a = cfg->ntype_limits < DSP_TYPE_LIMITS_MAX
                            ? realloc(cfg->type_limits, (cfg->ntype_limits + 1) * sizeof *a)
                            : NULL;
    if (!a) {
        free(l.type);
        snprintf(err, errlen, "--type-limit: at most %d types", DSP_TYPE_LIMITS_MAX);
        return -1;
    }
    cfg->type_limits = a;
    a[cfg->ntype_limits++] = l;
    return 0;
}

static int set_value(dsp_config *cfg, const opt_def *o, const char *val, char *err, size_t errlen)
{
    void *field = (char *)cfg + o->offset;
    switch (o->kind) {
    case OPT_STRING:
    case OPT_HOSTPORT: {
        if (o->kind == OPT_HOSTPORT) {
            char host[256];
            unsigned port;
            char why[96];
            if (dsp_hostport_split(val, host, sizeof host, &port, why, sizeof why) < 0) {
                snprintf(err, errlen, "--%s '%s': %s", o->name, val, why);
                return -1;
            }
        }
        char **s = field;
        free(*s);
        *s = strdup(val);
        return 0;
    }
    case OPT_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end || v < o->min || v > o->max) {
            snprintf(err, errlen, "--%s: '%s' is not a whole number from %lld to %lld", o->name,
                     val, (long long)o->min, (long long)o->max);
            return -1;
        }
        *(int64_t *)field = v;
        return 0;
    }
    case OPT_MS: {
        int64_t v;
        if (dsp_duration_ms(val, &v) < 0 || v < o->min || v > o->max) {
            snprintf(err, errlen,
                     "--%s: '%s' is not a duration from %lld to %lld ms (a number of ms, or one with"
                     " a unit: 250ms, 30s, 5m, 2h, 1d)",
                     o->name, val, (long long)o->min, (long long)o->max);
            return -1;
        }
        *(int64_t *)field = v;
        return 0;
    }
    case OPT_DURATION:
        if (dsp_duration_parse(val, (int64_t *)field) < 0) {
            snprintf(err, errlen, "--%s: '%s' is not a duration such as 90s, 12h, 7d or keep",
                     o->name, val);
            return -1;
        }
        return 0;
    case OPT_SCHED:
        if (strcmp(val, "round-robin") == 0)
            *(int *)field = DSP_SCHED_ROUND_ROBIN;
        else if (strcmp(val, "least-loaded") == 0)
            *(int *)field = DSP_SCHED_LEAST_LOADED;
        else {
            snprintf(err, errlen, "--%s: '%s' is neither round-robin nor least-loaded", o->name, val);
            return -1;
        }
        return 0;
    case OPT_DIALECT:
        if (strcmp(val, "auto") == 0)
            *(int *)field = DSP_SQL_DIALECT_AUTO;
        else if (strcmp(val, "mysql") == 0)
            *(int *)field = DSP_SQL_DIALECT_MYSQL;
        else if (strcmp(val, "mariadb") == 0)
            *(int *)field = DSP_SQL_DIALECT_MARIADB;
        else {
            snprintf(err, errlen, "--%s: '%s' is not auto, mysql or mariadb", o->name, val);
            return -1;
        }
        return 0;
    case OPT_WAKE:
        if (strcmp(val, "auto") == 0)
            *(int *)field = DSP_WAKE_AUTO;
        else if (strcmp(val, "binlog") == 0)
            *(int *)field = DSP_WAKE_BINLOG;
        else if (strcmp(val, "poll") == 0)
            *(int *)field = DSP_WAKE_POLL;
        else {
            snprintf(err, errlen, "--%s: '%s' is not auto, binlog or poll", o->name, val);
            return -1;
        }
        return 0;
    case OPT_TYPE_LIMIT:
        return add_type_limit(cfg, val, false, err, errlen);
    case OPT_GROUP_LIMIT:
        return add_type_limit(cfg, val, true, err, errlen);
    case OPT_LOGLEVEL: {
        int lvl = dsp_log_level_parse(val);
        if (lvl < 0) {
            snprintf(err, errlen, "--%s: '%s' is not error, warn, info or debug", o->name, val);
            return -1;
        }
        *(int *)field = lvl;
        return 0;
    }
    }
    return -1;
}

static const opt_def *find_option(const char *name)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strcmp(option_table[i].name, name) == 0)
            return &option_table[i];
    return NULL;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

/* Longest line of a --config file; a longer one is refused, not cut in two
 * (its tail would otherwise be read as a line of its own). */
#define CONFIG_LINE_MAX 4096

int dsp_config_apply_file(dsp_config *cfg, FILE *f, const char *name, char *err, size_t errlen)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((size_t)n > CONFIG_LINE_MAX || strlen(line) != (size_t)n) {
            snprintf(err, errlen, "%s:%d: a line must be text of at most %d bytes", name, lineno,
                     CONFIG_LINE_MAX);
            rc = -1;
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected KEY = VALUE", name, lineno);
            rc = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        const opt_def *o = find_option(key);
        if (!o || strcmp(key, "config") == 0) {
            snprintf(err, errlen, "%s:%d: unknown key '%s'", name, lineno, key);
            rc = -1;
            break;
        }
        char inner[512];
        if (set_value(cfg, o, val, inner, sizeof inner) < 0) {
            snprintf(err, errlen, "%s:%d: %s", name, lineno, inner);
            rc = -1;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error", name);
        rc = -1;
    }
    free(line);
    return rc;
}

static int load_file(dsp_config *cfg, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--config %s: %s", path, strerror(errno));
        return -1;
    }
    /* The limits of the file say so in /stats. */
    cfg->limit_source = DSP_LIMIT_CONFIG;
    int rc = dsp_config_apply_file(cfg, f, path, err, errlen);
    cfg->limit_source = DSP_LIMIT_FLAG;
    fclose(f);
    return rc;
}

static int read_token(const char *flag, const char *path, char **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--%s %s: %s", flag, path, strerror(errno));
        return -1;
    }
    char buf[PROTO_MAX_TOKEN_LEN + 2];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *t = trim(buf);
    if (!*t || strlen(t) > PROTO_MAX_TOKEN_LEN) {
        snprintf(err, errlen, "--%s %s: the token must be 1 to %d bytes", flag, path,
                 PROTO_MAX_TOKEN_LEN);
        return -1;
    }
    *out = strdup(t);
    return 0;
}

/* TLS flags go together, and their files are loaded once here so that a bad
 * one is a bad flag (exit 2), not a failure at start-up. */
static int check_tls(const dsp_config *cfg, char *err, size_t errlen)
{
    if (!cfg->tls_cert && !cfg->tls_key && !cfg->tls_ca)
        return 0;
    if (!cfg->tls_cert || !cfg->tls_key) {
        snprintf(err, errlen, "%s", cfg->tls_cert  ? "--tls-cert needs --tls-key"
                                    : cfg->tls_key ? "--tls-key needs --tls-cert"
                                                   : "--tls-ca needs --tls-cert and --tls-key");
        return -1;
    }
    dsp_tls *tls = dsp_tls_new(cfg->tls_cert, cfg->tls_key, cfg->tls_ca, err, errlen);
    dsp_tls_free(tls);
    return tls ? 0 : -1;
}

/* The option word getopt_long just took: argv[optind - 1] for --name=value and flags
 * without a value, argv[optind - 2] when the value was the next word. */
static const char *abbrev_token(char **argv, int optind_now, const char *arg)
{
    const char *last = argv[optind_now - 1];
    const char *eq = strncmp(last, "--", 2) == 0 ? strchr(last, '=') : NULL;

    if (arg == NULL || (eq != NULL && arg == eq + 1))
        return last;
    return optind_now >= 2 ? argv[optind_now - 2] : last;
}

/* Whether the word that named the option is "--NAME" or "--NAME=..." in full. */
static bool whole_name(char **argv, int optind_now, const char *arg, const char *name)
{
    const char *w = abbrev_token(argv, optind_now, arg);
    size_t n = strlen(name);

    return strncmp(w, "--", 2) == 0 && strncmp(w + 2, name, n) == 0 &&
           (w[2 + n] == '\0' || w[2 + n] == '=');
}

/* --table: a name taskpush can put in its statements unquoted, whose derived names and
 * leadership lock (with a shard's name) fit MySQL's 64 bytes (tables.h, db.h). */
static int check_table(const dsp_config *cfg, char *err, size_t errlen)
{
    const char *t = cfg->table ? cfg->table : DSP_TABLE_NAME_DEFAULT;
    size_t n = strlen(t), sl = cfg->shard_spec.ntypes ? strlen(cfg->shard_spec.name) : 0;

    if (!dsp_table_name_valid(t, n)) {
        snprintf(err, errlen,
                 "--table '%.64s': a table name is 1 to %d bytes of A-Z, a-z, 0-9 and _, not starting"
                 " with a digit",
                 t, DSP_TABLE_NAME_MAX);
        return -1;
    }
    /* 'taskpush/NAME.' + at least one byte of the database's name + '.SHARD' */
    if (strcmp(t, DSP_TABLE_NAME_DEFAULT) != 0 && sl > 0 &&
        sizeof "taskpush/." - 1 + n + 1 + 1 + sl > DSP_DB_LOCK_NAME_MAX) {
        snprintf(err, errlen,
                 "--table '%s' and the shard's name '%s' make a lock name longer than MySQL's %d"
                 " bytes: shorten one",
                 t, cfg->shard_spec.name, DSP_DB_LOCK_NAME_MAX);
        return -1;
    }
    return 0;
}

int dsp_config_load(dsp_config *cfg, int argc, char **argv, FILE *out, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    char numbuf[32];
    snprintf(numbuf, sizeof numbuf, "%u", PROTO_MAX_BODY_DEFAULT);
    for (size_t i = 0; i < NOPTIONS; i++) {
        const opt_def *o = &option_table[i];
        const char *def = o->def;
        if (!def && strcmp(o->name, "max-frame") == 0)
            def = numbuf;
        if (def && set_value(cfg, o, def, err, errlen) < 0)
            return DSP_CONFIG_BAD;
    }

    /* Parse argv first into a list, so that the config file (named on the
     * command line) can be applied before the flags that override it. */
    struct option longopts[NOPTIONS + 4];
    for (size_t i = 0; i < NOPTIONS; i++)
        longopts[i] = (struct option){option_table[i].name, required_argument, NULL,
                                      OPT_TABLE_BASE + (int)i};
    longopts[NOPTIONS] = (struct option){"help", no_argument, NULL, OPT_HELP};
    longopts[NOPTIONS + 1] = (struct option){"version", no_argument, NULL, OPT_VERSION};
    longopts[NOPTIONS + 2] = (struct option){"migrate", no_argument, NULL, OPT_MIGRATE};
    longopts[NOPTIONS + 3] = (struct option){NULL, 0, NULL, 0};

    int nset = 0;
    int *set_idx = calloc((size_t)argc + 1, sizeof *set_idx);
    char **set_val = calloc((size_t)argc + 1, sizeof *set_val);
    int rc = DSP_CONFIG_BAD;
    if (!set_idx || !set_val) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    optind = 1;
    opterr = 0;
    int c, li;
    /* "+": options end at the first other word (which is then an error). */
    while ((li = -1, c = getopt_long(argc, argv, "+:hV", longopts, &li)) != -1) {
        /* getopt_long takes any unambiguous abbreviation (--table for --table-stats-ms):
         * only whole names are flags, so a new flag never changes what an old command
         * line means. */
        if (li >= 0 && c != '?' && c != ':' && !whole_name(argv, optind, optarg, longopts[li].name)) {
            snprintf(err, errlen, "unknown option '%.64s' (flags are not abbreviated: --%s?)",
                     abbrev_token(argv, optind, optarg), longopts[li].name);
            goto done;
        }
        if (c == OPT_HELP) {
            usage(out);
            rc = DSP_CONFIG_EXIT_OK;
            goto done;
        }
        if (c == OPT_VERSION) {
            fprintf(out, "taskpushd %s (protocol %d)\n", TASKPUSH_VERSION, PROTO_VERSION);
            rc = DSP_CONFIG_EXIT_OK;
            goto done;
        }
        if (c == OPT_MIGRATE) {
            cfg->migrate = true;
            continue;
        }
        if (c == ':') {
            snprintf(err, errlen, "option '%s' needs a value", argv[optind - 1]);
            goto done;
        }
        if (c == '?' || c < OPT_TABLE_BASE) {
            snprintf(err, errlen, "unknown option '%s'", argv[optind - 1]);
            goto done;
        }
        set_idx[nset] = c - OPT_TABLE_BASE;
        set_val[nset++] = optarg;
    }
    if (optind < argc) {
        snprintf(err, errlen, "unexpected argument '%s'", argv[optind]);
        goto done;
    }
    for (int i = 0; i < nset; i++)
        if (strcmp(option_table[set_idx[i]].name, "config") == 0 &&
            (set_value(cfg, &option_table[set_idx[i]], set_val[i], err, errlen) < 0 ||
             load_file(cfg, set_val[i], err, errlen) < 0))
            goto done;

    const char *env = getenv("TASKPUSH_DB");
    if (env && *env && set_value(cfg, find_option("db"), env, err, errlen) < 0)
        goto done;
    for (int i = 0; i < nset; i++)
        if (set_value(cfg, &option_table[set_idx[i]], set_val[i], err, errlen) < 0)
            goto done;

    if (!cfg->db) {
        snprintf(err, errlen, "--db URL is required (or set TASKPUSH_DB)");
        goto done;
    }
    if (dsp_db_url_parse(cfg->db, &cfg->db_url, err, errlen) < 0)
        goto done;
    if (!cfg->db_url.password) {
        const char *pw = getenv("TASKPUSH_DB_PASSWORD");
        if (pw)
            cfg->db_url.password = strdup(pw);
    }
    if (cfg->token_file) {
        if (read_token("token-file", cfg->token_file, &cfg->token, err, errlen) < 0)
            goto done;
    } else if ((env = getenv("TASKPUSH_TOKEN")) && *env) {
        cfg->token = strdup(env);
    }
    if (check_tls(cfg, err, errlen) < 0)
        goto done;
    /* At least two renewals per lease, so that one slow statement costs no leadership.
     * One flag alone is checked against the other's one-server default (db.h). */
    if (cfg->lease_ms > 0 || cfg->lease_renew_ms > 0) {
        int64_t lease = cfg->lease_ms > 0 ? cfg->lease_ms : DSP_LEASE_MS_DEFAULT;
        int64_t renew = cfg->lease_renew_ms > 0 ? cfg->lease_renew_ms : DSP_LEASE_RENEW_MS_DEFAULT;
        if (renew * 2 > lease) {
            snprintf(err, errlen, "--lease-renew-ms %lld must be at most half of --lease-ms %lld",
                     (long long)renew, (long long)lease);
            goto done;
        }
    }
    if ((int64_t)cfg->ntype_limits > cfg->max_types) {
        snprintf(err, errlen, "%zu --type-limit entries, more than --max-types %lld", cfg->ntype_limits,
                 (long long)cfg->max_types);
        goto done;
    }
    if (dsp_shard_parse(&cfg->shard_spec, cfg->types, cfg->shard, (size_t)cfg->max_types, err,
                        errlen) < 0)
        goto done;
    if (check_table(cfg, err, errlen) < 0)
        goto done;
    if (cfg->admin_token_file) {
        if (read_token("admin-token-file", cfg->admin_token_file, &cfg->admin_token, err,
                       errlen) < 0)
            goto done;
    } else if ((env = getenv("TASKPUSH_ADMIN_TOKEN")) && *env) {
        cfg->admin_token = strdup(env);
    }
    rc = DSP_CONFIG_OK;
done:
    free(set_idx);
    free(set_val);
    return rc;
}

void dsp_config_free(dsp_config *cfg)
{
    for (size_t i = 0; i < NOPTIONS; i++) {
        const opt_def *o = &option_table[i];
        if (o->kind == OPT_STRING || o->kind == OPT_HOSTPORT) {
            char **s = (char **)((char *)cfg + o->offset);
            free(*s);
            *s = NULL;
        }
    }
    for (size_t i = 0; i < cfg->ntype_limits; i++)
        free(cfg->type_limits[i].type);
    free(cfg->type_limits);
    cfg->type_limits = NULL;
    cfg->ntype_limits = 0;
    free(cfg->token);
    cfg->token = NULL;
    dsp_shard_free(&cfg->shard_spec);
    free(cfg->admin_token);
    cfg->admin_token = NULL;
    dsp_db_url_clear(&cfg->db_url);
}

void dsp_config_each(const dsp_config *cfg, void (*emit)(void *arg, const char *key, const char *val),
                     void *arg)
{
    for (size_t i = 0; i < NOPTIONS; i++) {
        const opt_def *o = &option_table[i];
        const void *field = (const char *)cfg + o->offset;
        char buf[64];
        const char *val = buf;
        switch (o->kind) {
        case OPT_STRING:
        case OPT_HOSTPORT:
            val = *(char *const *)field;
            if (val && strcmp(o->name, "db") == 0 && cfg->db_url.password)
                val = "(set, has a password)";
            break;
        case OPT_INT:
        case OPT_MS:
        case OPT_DURATION:
            snprintf(buf, sizeof buf, "%lld", (long long)*(const int64_t *)field);
            break;
        case OPT_SCHED:
            val = dsp_sched_policy_name(*(const int *)field);
            break;
        case OPT_LOGLEVEL:
            val = dsp_log_level_name(*(const int *)field);
            break;
        case OPT_DIALECT:
            val = dsp_sql_dialect_name(*(const int *)field);
            break;
        case OPT_WAKE:
            val = dsp_wake_mode_name(*(const int *)field);
            break;
        case OPT_TYPE_LIMIT: /* the limits themselves are in /stats "limits" */
        case OPT_GROUP_LIMIT:
            snprintf(buf, sizeof buf, "%zu types", cfg->ntype_limits);
            break;
        }
        emit(arg, o->name, val ? val : "");
    }
}
