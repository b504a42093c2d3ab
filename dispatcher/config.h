/* config.h: taskpushd's settings, defined once in a table (config.c) that
 * drives the flags, the --config file, the defaults, validation and the
 * settings shown back on the admin port. */
#ifndef TASKPUSH_DSP_CONFIG_H
#define TASKPUSH_DSP_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "db.h" /* dsp_db_url */
#include "shard.h"

enum dsp_sched_policy { DSP_SCHED_ROUND_ROBIN = 0, DSP_SCHED_LEAST_LOADED = 1 };

/* A per-type limit (--type-limit T:concurrency=N,rate=R): at most N deliveries of type
 * T running at once, at most R started per second; 0 is no limit (dispatch.c). */
#define DSP_LIMIT_MAX 1000000     /* largest N and R */
#define DSP_TYPE_LIMITS_MAX 10000 /* most --type-limit entries (and at most --max-types) */
/* Where a type's limits came from (/stats "limits" source). */
enum dsp_limit_source { DSP_LIMIT_FLAG = 0, DSP_LIMIT_CONFIG, DSP_LIMIT_RUNTIME };

typedef struct dsp_type_limit {
    char *type;           /* owned */
    uint32_t concurrency; /* 0: none */
    uint32_t rate;        /* starts per second; 0: none */
    uint32_t per_group;   /* in flight at once per group_key (--group-limit); 0: none */
    bool per_group_named; /* the text named per_group (parse only: a later --type-limit
                           * without it keeps an earlier --group-limit) */
    enum dsp_limit_source source; /* the flag, the config file, or set at run time */
} dsp_type_limit;

/* Parses "T:concurrency=N,rate=R,per_group=G" (any key may be left out, not all): T is the text
 * before the last ':', 1 to 256 bytes of UTF-8. On 0 out->type is malloc'd; on -1 err
 * says why. */
int dsp_type_limit_parse(const char *text, dsp_type_limit *out, char *err, size_t errlen)
    __attribute__((warn_unused_result));

typedef struct dsp_config {
    char *db;          /* the URL as given */
    dsp_db_url db_url; /* parsed, password filled from TASKPUSH_DB_PASSWORD if absent */
    char *listen;      /* HOST:PORT for workers */
    char *admin;       /* HOST:PORT for HTTP */
    int scheduler;     /* enum dsp_sched_policy */
    int sql_dialect;   /* enum dsp_sql_dialect (db.h) */
    int wake;          /* enum dsp_wake_mode (db.h): --wake */
    int64_t batch;     /* most tasks claimed per transaction */
    int64_t poll_ms;
    int64_t task_timeout_ms;
    int64_t prefetch;
    int64_t prefetch_ms;     /* claim ahead what the workers finish in this long; 0: --prefetch */
    int64_t claim_split; /* a claim keeping this many rows is split over two connections; 0: never */
    int64_t max_buffered_bytes; /* payload bytes held (buffered and in flight): claims stop at it */
    int64_t heartbeat_ms;
    int64_t shutdown_grace_ms;
    int64_t result_flush_ms; /* longest a result waits before it is written */
    int64_t max_frame;       /* largest frame body accepted from a worker */
    int64_t max_capacity;    /* a HELLO's capacity is cut to this */
    int64_t max_connections; /* worker connections at once */
    int64_t max_conn_output_bytes; /* output waiting for one peer beyond which it is stalled */
    int64_t max_submit_bytes;      /* submissions held for the database, all connections */
    int64_t admin_max_connections; /* admin HTTP connections at once */
    int64_t admin_request_timeout_ms; /* a whole admin request must arrive within this */
    int64_t max_failed_handshakes; /* per second; more pause the listener (0: no limit) */
    int64_t max_types_per_worker;
    int64_t max_types;       /* distinct types held by all workers */
    int64_t max_timeouts;    /* consecutive lease expiries before a worker is dropped */
    int64_t max_unwritten;   /* outcomes waiting for the database before dispatch pauses */
    int64_t max_unwritten_bytes; /* their result and error bytes before dispatch pauses */
    int64_t adopt_grace_ms;  /* a new leader recovers older epochs' rows only after this */
    int64_t orphan_grace_ms; /* buffered tasks of a type with no worker go back after this */
    char *token_file;
    char *token;       /* read from token_file or TASKPUSH_TOKEN; NULL when none */
    char *admin_token_file;
    char *admin_token; /* admin_token_file or TASKPUSH_ADMIN_TOKEN; NULL: admin POSTs use token */
    int log_level;     /* enum dsp_log_level */
    int64_t retry_backoff_ms;     /* first retry delay; doubles per attempt */
    int64_t retry_backoff_max_ms; /* cap of the retry delay */
    int64_t retain_finished_ms; /* delete SUCCESSFUL rows older than this; 0 keeps all */
    int64_t retain_failed_ms;   /* delete FAILED rows older than this; 0 keeps all */
    int64_t table_stats_ms;     /* refresh interval of the table-side figures */
    int64_t lease_ms;           /* the leadership lease: a standby takes over after it */
    int64_t lease_renew_ms;     /* how often the leader renews the lease */
    char *table;       /* --table NAME: the task table (tables.h names the others); "task" */
    char *types;       /* --types as given: the task types this dispatcher's shard owns */
    char *shard;       /* --shard NAME, or NULL: derived from --types */
    dsp_shard shard_spec; /* --types and --shard parsed; empty: unsharded */
    char *ready_file;  /* written once the ports listen: {"pid","listen","admin"} */
    char *tls_cert;    /* PEM: with tls_key, both ports speak TLS only */
    char *tls_key;
    char *tls_ca;      /* PEM: workers must present a certificate signed by it */
    char *config_file;
    dsp_type_limit *type_limits; /* --type-limit, one per type (a later one replaces) */
    size_t ntype_limits;
    enum dsp_limit_source limit_source; /* while parsing: what --type-limit entries come from */
    bool migrate;      /* --migrate: upgrade the schema, then exit (an action, not a key) */
} dsp_config;

enum dsp_config_result {
    DSP_CONFIG_OK = 0,
    DSP_CONFIG_EXIT_OK = 1,    /* --help or --version printed: exit 0 */
    DSP_CONFIG_BAD = -1,       /* message in err: exit 2 */
};

/* Fills cfg from defaults, then --config, then the environment (TASKPUSH_DB,
 * TASKPUSH_DB_PASSWORD, TASKPUSH_TOKEN, TASKPUSH_ADMIN_TOKEN), then argv. On
 * DSP_CONFIG_BAD, err holds a one-line reason. help/version text goes to out. Caller frees with
 * dsp_config_free in every case. */
int dsp_config_load(dsp_config *cfg, int argc, char **argv, FILE *out, char *err, size_t errlen)
    __attribute__((warn_unused_result));
void dsp_config_free(dsp_config *cfg);

/* Applies the KEY = VALUE lines of a --config file read from f (named name in
 * messages) over cfg; what dsp_config_load does with --config, for the fuzz
 * target (tests/fuzz/fuzz_config.c). Returns 0, or -1 with a reason in err. */
int dsp_config_apply_file(dsp_config *cfg, FILE *f, const char *name, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Parses mysql://USER[:PASSWORD]@HOST[:PORT]/DBNAME[?socket=PATH]. Returns 0,
 * or -1 with a reason in err. */
int dsp_db_url_parse(const char *url, dsp_db_url *out, char *err, size_t errlen)
    __attribute__((warn_unused_result));
void dsp_db_url_clear(dsp_db_url *u);

/* The one reading of a duration, for every duration flag and config key: a whole
 * number (digits only) with a unit ms, s, m, h or d ("250ms", "90s", "7d"); a bare
 * number is milliseconds. Returns 0, or -1 for anything else and for more than
 * INT64_MAX ms. dsp_duration_parse also takes "keep" (0: never). */
int dsp_duration_ms(const char *s, int64_t *ms);
int dsp_duration_parse(const char *s, int64_t *ms);

/* Splits "HOST:PORT" (HOST may be [v6], PORT 0..65535); returns 0 or -1. host is
 * caller's buffer. */
int dsp_hostport_parse(const char *s, char *host, size_t hostlen, unsigned *port);
/* The same, and on -1 says in why (when not NULL) what is wrong: a scheme, a path, no
 * port, a port out of range, an empty host, an IPv6 address without brackets. */
int dsp_hostport_split(const char *s, char *host, size_t hostlen, unsigned *port, char *why,
                       size_t whylen);
/* Writes "HOST:PORT", with an IPv6 host in brackets ("[::1]:7070"), so that what the
 * daemon prints (ready file, log) is an address its flags and clients take back. */
void dsp_hostport_format(char *out, size_t outlen, const char *host, unsigned port);

/* Calls emit(arg, key, value-as-text) for every setting, for /stats and logs;
 * secrets are shown as "(set)". */
void dsp_config_each(const dsp_config *cfg, void (*emit)(void *arg, const char *key, const char *val),
                     void *arg);

const char *dsp_sched_policy_name(int policy);

#endif
