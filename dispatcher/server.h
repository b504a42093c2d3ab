/* server.h: the dispatcher's in-memory state, owned by the event loop thread.
 *
 * A claimed task lives in exactly one place: its type's queue (buffered, in
 * dispatch order) or its holder's in-flight list (delivered). The task map
 * finds it by id. Tasks leave memory when their outcome is handed to the
 * database thread, or when they are released back to NEW. */
#ifndef TASKPUSH_DSP_SERVER_H
#define TASKPUSH_DSP_SERVER_H

#include "clock.h"
#include "config.h"
#include "db.h"
#include "deadline.h"
#include "log.h"
#include "dispatch.h"
#include "history.h"
#include "stats.h"
#include "taskmap.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event;
struct event_base;
struct evconnlistener;
struct evhttp;

typedef struct dsp_server dsp_server;
typedef struct dsp_conn dsp_conn;
typedef struct dsp_type dsp_type;
typedef struct dsp_task dsp_task;

/* The latest PROGRESS a worker reported for a delivery it holds (protocol version 4):
 * kept in memory for /task and the dashboard, written to the table at most once a
 * second (docs/taskpushd.md, "Progress"). */
#define DSP_PROGRESS_MSG_MAX 256 /* PROTO_MAX_PROGRESS_MSG (conn.c checks) */
typedef struct dsp_progress {
    uint32_t attempt;    /* the delivery it was reported for: another attempt's is stale */
    uint16_t permille;   /* 0 .. 1000 */
    uint16_t msg_len;    /* 0 .. DSP_PROGRESS_MSG_MAX: validated UTF-8 without NUL */
    int64_t at_ms;       /* wall clock of the report */
    bool dirty;          /* changed since last handed to the database (on progress.dirty) */
    bool stored;         /* a row of it was handed to the database: delete it at the end */
    char msg[DSP_PROGRESS_MSG_MAX + 1];
} dsp_progress;

/* Longest group_key (VARBINARY(191) of the table). */
#define DSP_GROUP_KEY_MAX 191

struct dsp_task {
    uint64_t id;
    uint64_t seq;          /* dispatch order: claim after claim, priority desc, id asc */
    uint64_t claim_seq;    /* the task_claim row listing it (db_claim_log.c); 0: none */
    dsp_type *type;
    uint32_t attempts;     /* the row's attempts plus deliveries made since the claim */
    uint32_t max_attempts;
    uint32_t timeout_ms;
    uint8_t priority;
    bool recorded;         /* the current delivery's attempt is written (DSP_WRITE_DELIVERED) */
    bool adopted;          /* declared by a worker (HOLDING) and adopted: no payload here, so
                            * taken back it goes to NEW rather than to a worker (inventory.c) */
    uint32_t dlv_epoch;    /* the epoch its current delivery names: the leader's, or for an
                            * adopted one the epoch it was delivered under */
    dsp_conn *holder;      /* current delivery, NULL while buffered */
    int64_t deadline_ms;   /* end of the current delivery's lease */
    dsp_deadline_node lease; /* in srv->sched.leases while delivered: when the tick looks next */
    int64_t delivered_us;  /* monotonic time of the current delivery (execution histogram) */
    dsp_task *prev, *next; /* in the type's queue, or in the holder's in-flight list */
    size_t payload_len;
    uint8_t *payload;
    dsp_progress *progress; /* the latest PROGRESS of a delivery, NULL before the first */
    /* The row's group_key (fair share, --group-limit): group_key_len bytes, 0 .. 191;
     * has_group_key false for NULL (such a task counts against no per-key limit). */
    bool has_group_key;
    bool group_counted;    /* counted in its type's running per key (groups.c) */
    uint8_t group_key_len;
    uint8_t group_key[DSP_GROUP_KEY_MAX]; /* stays last: dsp_server_task_new zeroes up to it */
};

/* A task type lives while a worker registered it, a task of it is buffered, or an
 * operator paused it; then it is freed (dsp_server_type_unref), so that memory and
 * the work of a dispatch pass depend on the types in use, not on every type a peer
 * ever named. */
struct dsp_type {
    char *name;
    size_t len;
    dsp_task *head[DSP_PRIORITIES], *tail[DSP_PRIORITIES]; /* buffered tasks by priority,
                               * each list in ascending seq (dispatch.c) */
    size_t nbuffered;
    dsp_pace pace;            /* deliveries of this type answered per second */
    dsp_sched_slots **workers; /* &conn->slots of every registered worker */
    size_t nworkers, cap;
    size_t cursor;            /* rotation point of the scheduler */
    dsp_ll_heap ll;           /* least-loaded over many workers, for one pass (dispatch.h) */
    uint64_t room;            /* free slots summed over accepting workers of this type */
    bool paused;              /* POST /pause?type=: neither claimed nor dispatched */
    uint32_t max_running;     /* --type-limit concurrency (0: none), from srv->limits.items */
    uint32_t max_rate;        /* --type-limit rate: starts per second (0: none) */
    uint64_t running;         /* its deliveries in flight (dispatch.c's accounting) */
    uint32_t max_per_group;   /* --group-limit: deliveries in flight per group_key (0: none) */
    struct dsp_group_run *gruns; /* per key with deliveries in flight: how many (groups.c);
                               * only while max_per_group is set */
    size_t ngruns, gruns_cap;
    uint64_t answered_ok, answered_failed; /* workers' outcomes of its deliveries since the
                               * type was made: successes, and failures (retried or not;
                               * RETRY_AFTER is neither) */
    dsp_bucket bucket;        /* the rate limit's tokens */
    int64_t rows_seen_ms;     /* when a claim returned rows of it, or the table figures
                               * showed ready rows of it; 0: never (claim_maybe) */
    int64_t orphaned_ms;      /* when it was left with buffered tasks and no worker; 0: not */
    dsp_type *prev, *next;    /* every type */
    dsp_type *hnext;          /* the next type in its bucket of the server's type index */
    uint32_t hash;
    dsp_type *busy_prev, *busy_next; /* types with buffered tasks (dispatch scans only these) */
};

/* The loop's state, by concern: each group says what it is for and which file owns it
 * (keeps it up to date; the others mostly read it). The events are made and freed by
 * server.c's set-up (the admin port's by admin_http.c, the claim timer through
 * dsp_claim_pacing_init). Nothing here is read by another thread. */
struct dsp_server {
    /* The wiring (server.c). */
    const dsp_config *cfg;
    dsp_log log;
    struct event_base *base;
    dsp_db *db;
    struct dsp_tls *tls;       /* NULL unless --tls-cert: both ports speak TLS */
    struct event *signal_evs[3];
    struct event *dispatch_ev; /* activated when slots or tasks appear; runs once per loop pass */
    bool dispatch_due;         /* dispatch_ev is active and its pass has not started yet */
    int exit_code;

    /* Accept control: the worker port's listener, its back-off after accept() failed and
     * the rationing of accepts under a flood of failed handshakes (server.c). */
    struct {
        struct evconnlistener *listener;
        struct event *retry_ev;     /* re-enables the listener after EMFILE and friends */
        int64_t backoff_ms;
        int64_t handshake_window;   /* which FAILED_HANDSHAKE_WINDOW_MS window the counts are of */
        int64_t failed_handshakes;  /* in that window */
        int64_t accepts_in_window;  /* in that window */
        int64_t flood_until_window; /* accepts are rationed up to this window (a flood was seen) */
    } accept;

    /* The admin port (admin_http.c): each connection is known from its accept, for the
     * cap and the deadline of a whole request. */
    struct {
        struct evhttp *http;
        struct dsp_admin_conn *conns;
        size_t nconns;
        struct event *adopt_ev, *tick_ev;
        bool loopback;             /* it listens on loopback only: Host is checked */
    } admin;

    /* The two ports as bound (port 0 resolved), for the answers to a peer at the wrong
     * one (conn.c, admin_http.c). */
    char listen_bound[300], admin_bound[300];

    /* Tasks finished on the connections of workers that left, by /metrics label
     * (stats.c): a worker's counter goes on across its reconnects, one series per name.
     * At most DSP_WORKER_NAMES_MAX names; past that the one gone longest is dropped. */
    struct {
        struct dsp_worker_total *v;
        size_t n;
    } worker_totals;

    /* Operator state: pause, drain (the admin port's and SIGTERM's), requeue (server.c's
     * operator requests). */
    struct {
        bool paused_all;           /* POST /pause: nothing claimed or dispatched */
        bool admin_draining;       /* POST /drain: no claims, buffered tasks released; /resume ends it */
        bool draining;             /* SIGTERM/SIGINT: shutting down once the deliveries end */
        int64_t drain_deadline_ms;
        uint64_t next_request_id;
        dsp_requeue_status last_requeue;
        /* The runtime settings (settings table): a new leader claims nothing until it
         * read and applied them (settings_gen names the read awaited). */
        bool settings_pending;
        uint64_t settings_gen;
        int64_t settings_read_ms; /* when the last read was applied (wall ms; 0: never) */
        size_t settings_rows;     /* rows it had */
    } control;

    /* Claim pacing: when the next claim may be asked, the one outstanding, and which
     * types it asks for (dispatch.c; other files go through dsp_claim_pacing_*). */
    struct {
        struct event *timer;
        bool timer_armed;
        bool outstanding;
        uint32_t requested;        /* total asked of the outstanding claim */
        int64_t sent_ms;           /* when the outstanding claim was asked */
        double round_trip_ms;      /* claims' round trips, averaged (the ahead covers two) */
        int64_t not_before;        /* earliest time of the next claim (poll back-off) */
        bool again;                /* rows were committed ready while a claim ran: claim at once
                                    * after it, whatever it found (dsp_dispatch_claim_now) */
        int64_t join_ms;           /* the last claim hastened by a worker joining */
        int64_t gather_until;      /* a small claim waits until then for more room */
        size_t rotor[2];           /* where the next claim starts among cold [0] and warm [1]
                                    * types (see dsp_dispatch_claim_maybe) */
        /* The binary log's doorbell (--wake, dsp_dispatch_on_wake): claims left to retry
         * after one found nothing (the row's commit may not be visible yet), and the
         * future run_after times to claim at, sorted, at most DSP_WAKE_DUES_MAX. */
        unsigned wake_retries;
        int64_t wake_at;           /* a rung claim deferred to then (the gap); 0: none */
        int64_t wake_gap_ms;       /* the gap now: WAKE_GAP_MS, up to --poll-ms in a flood */
        unsigned wake_flood;       /* claims in a row that found several rows */
        bool wake_resting;         /* the follower was asked to rest (dsp_db_wake_rest) */
        struct event *due_timer;
        int64_t dues[DSP_WAKE_DUES_MAX];
        size_t ndues;
    } claim;

    /* Scheduling: the workers, their free slots, what is buffered and in flight, the
     * leases (dispatch.c; server.c and inventory.c also count nbuffered and take next_seq
     * as they hold tasks, and the tick clears limit_waiting). */
    struct {
        uint64_t gen;              /* moves at each dispatch pass, join and leave: the
                                    * types' least-loaded heaps older than it are stale */
        size_t nworkers;           /* connections past HELLO */
        uint64_t room;             /* free slots over accepting workers */
        uint64_t nbuffered;
        uint64_t ninflight;        /* current deliveries (not counting cancelled ones) */
        uint64_t next_seq;         /* the dispatch order's next seq (claims take it) */
        dsp_type *busy_types;      /* the types with nbuffered > 0 */
        dsp_pace pace;             /* deliveries answered per second, all types */
        dsp_deadline_heap leases;  /* the current deliveries, by when the tick must look at them */
        bool limit_waiting;        /* a dispatch pass left a type waiting for its rate: the tick kicks */
    } sched;

    /* The task types (types.c). */
    struct {
        dsp_type *list;            /* every type */
        size_t n;
        dsp_type **buckets;        /* the type index, by hash of the name: interning is O(1) */
        size_t nbuckets;           /* a power of two, or 0 before the first type */
        char *gone_names;          /* types a worker registered, freed since: the names one after
                                    * another, each NUL-terminated, in one buffer */
        size_t ngone_names, gone_len, gone_cap;
    } types;

    /* The claimed tasks held, buffered or in flight: by id, their records, their payloads'
     * bytes (server.c). */
    struct {
        dsp_taskmap map;
        dsp_task *pool;            /* free records, linked by next (dsp_server_task_new) */
        struct dsp_task_block *blocks; /* what the pool was carved from */
        uint64_t payload_bytes;
    } tasks;

    /* Outcomes handed to the database once per loop pass (server.c). */
    struct {
        dsp_outcome *items;
        size_t n, cap;
        size_t bytes;              /* result and error bytes in it (--max-unwritten-bytes) */
    } outbox;

    /* The worker connections and their writes (conn.c). */
    struct {
        dsp_conn *list;            /* every connection, HELLO done or not */
        size_t n;
        uint64_t next_id;
        struct event *flush_ev;    /* writes the output of flush_head's connections */
        dsp_conn *flush_head;      /* plaintext connections with output added this loop pass */
        dsp_log_limit peer_log;    /* lines about peers: connections, HELLOs, bad frames (also
                                    * server.c's accepts and admin_http.c's connections) */
    } conns;

    /* Submissions held for the database (copies queued, frames reserved while they
     * arrive), all connections together, within --max-submit-bytes (conn.c). */
    struct {
        uint64_t bytes_held, bytes_reserved;
        size_t budget_waiters;     /* connections not read until the budget has room */
    } submit;

    /* Protocol version 3 (inventory.c). */
    struct {
        struct event *confirm_ev;  /* sends the CONFIRMs of confirm_head's connections */
        dsp_conn *confirm_head;    /* connections with CONFIRMs waiting */
        dsp_taskmap v3conns;       /* connection id -> welcomed version-3 connection (CONFIRM) */
    } inv;

    /* Progress reports on their way to the progress table (progress.c). */
    struct {
        uint64_t *dirty;           /* tasks whose report changed since it was written */
        size_t ndirty, dirty_cap;
        uint64_t *gone;            /* ended tasks whose row was written: to delete */
        size_t ngone, gone_cap;
        int64_t next_flush_ms;     /* monotonic: no batch before (one a second) */
    } progress;

    /* Our standing with the table: leadership and the database's health (server.c's
     * database callbacks). */
    struct {
        uint32_t epoch;
        bool leading;
        bool db_connected;
    } lead;

    /* Housekeeping: the tick and what it samples (server.c). */
    struct {
        struct event *timer;       /* leases, heartbeats, drain */
        int64_t rate_sample_ms;    /* the last sample of stats.rates */
        int64_t table_seen_ms;     /* the last table figures read for rows_seen_ms */
        size_t closed_since_trim;  /* connections freed since the last malloc_trim (conn.c counts) */
    } tick;

    /* Figures for /stats, /metrics and /history: counted where things happen, read by
     * stats.c and history.c. */
    struct {
        int64_t started_ms;
        dsp_task_stats tasks;
        dsp_conn_stats conns;
        dsp_rates rates;
        dsp_histograms hist;
        dsp_history history;       /* GET /history: the last hour, sampled by the tick (history.c) */
    } stats;

    /* Per-type limits by name: --type-limit, then POST /limit (limits.c). */
    struct {
        dsp_type_limit *items;
        size_t n;
    } limits;
};

/* Sets up sockets, timers and the database side. Returns 0 or -1 (logged). */
int dsp_server_init(dsp_server *srv, const dsp_config *cfg) __attribute__((warn_unused_result));
/* The loop and its timers only: no signal handler, listener, admin port or
 * database (srv->db stays NULL, and the db calls tolerate that). For the fuzz
 * targets (tests/fuzz/), which hand socketpairs to dsp_conn_accept and to
 * evhttp. Free with dsp_server_free. Returns 0 or -1. */
int dsp_server_init_offline(dsp_server *srv, const dsp_config *cfg) __attribute__((warn_unused_result));
/* Runs the loop until a drain ends; returns the exit status for main(). */
int dsp_server_run(dsp_server *srv);
void dsp_server_free(dsp_server *srv);

/* Called by conn.c. */
/* The type named name[0..len), created when new (NULL when out of memory). */
dsp_type *dsp_server_type_intern(dsp_server *srv, const uint8_t *name, size_t len);
/* Frees ty when nothing holds it any more (no worker, no buffered task, not paused). */
void dsp_server_type_release_if_unused(dsp_server *srv, dsp_type *ty);
/* The type named name[0..len), or NULL when there is none (types.c). */
dsp_type *dsp_server_type_find(const dsp_server *srv, const uint8_t *name, size_t len);
/* Whether a worker registered a type of this name since the start (it may be gone now);
 * remembers at most DSP_GONE_NAMES_MAX freed names (types.c). */
#define DSP_GONE_NAMES_MAX 1024
bool dsp_server_type_ever_registered(const dsp_server *srv, const char *name);
/* Frees every type and the index (at dsp_server_free). */
void dsp_server_types_free(dsp_server *srv);
void dsp_server_task_done(dsp_server *srv, dsp_conn *c, dsp_task *t, uint8_t outcome,
                          uint32_t retry_after_ms, const uint8_t *data, size_t len);
void dsp_server_kick(dsp_server *srv); /* schedule a dispatch pass */
/* A connection ended before its HELLO was accepted (refused, malformed, silent, or
 * closed by the peer): past --max-failed-handshakes a second, accepting pauses. */
void dsp_server_handshake_failed(dsp_server *srv);
/* A zeroed task record, NULL when out of memory; dsp_server_task_put gives it back. */
dsp_task *dsp_server_task_new(dsp_server *srv);
void dsp_server_task_put(dsp_server *srv, dsp_task *t);

/* Adds an entry to the outbox (handed to the write thread in this loop pass); its conn_id
 * and delivery are 0. Returns it, or NULL when out of memory (data is not taken). */
dsp_outcome *dsp_server_outbox_add(dsp_server *srv, uint64_t task_id, uint8_t kind,
                                   uint32_t attempts, int64_t run_after, const void *data, size_t len);

/* The retry delay of a FAIL_RETRY (the backoff) or RETRY_AFTER outcome. */
int64_t dsp_server_retry_delay_ms(const dsp_server *srv, uint8_t outcome, uint32_t retry_after_ms,
                                  uint32_t attempt, uint64_t task_id);

/* Called by dispatch.c. */
/* A delivery was lost (worker gone, lease expired): deliver again, or fail the
 * task when that was its last attempt. */
void dsp_server_take_back(dsp_server *srv, dsp_task *t, const char *why);

/* Per-type limits (limits.c). */
/* Copies --type-limit into srv->limits.items. Returns 0 or -1 (out of memory). */
int dsp_limits_init(dsp_server *srv);
void dsp_limits_free(dsp_server *srv);
/* Gives a type just interned its limits, if it has any. */
void dsp_limits_apply(const dsp_server *srv, dsp_type *ty);
/* POST /limit: sets type's limits (all 0 removes them), on the type held now too.
 * Returns NULL, or why not (--max-types entries already). */
const char *dsp_limits_set(dsp_server *srv, const char *type, uint32_t concurrency, uint32_t rate,
                           uint32_t per_group, enum dsp_limit_source source);
/* The runtime settings a new leader read from the table (docs/taskpushd.md "Runtime
 * settings"): applied over the flags' and the config file's. */
void dsp_settings_apply(dsp_server *srv, const dsp_setting *v, size_t n);
/* The limits of type, or NULL when it has none. */
const dsp_type_limit *dsp_limits_find(const dsp_server *srv, const char *type);

/* Operator requests (admin_http.c calls them). type NULL: every type. */
/* Returns NULL, or why a type cannot be paused (not UTF-8, --max-types reached). */
const char *dsp_server_pause(dsp_server *srv, const char *type);
void dsp_server_resume(dsp_server *srv, const char *type); /* without a type also ends a drain */
void dsp_server_drain(dsp_server *srv);
/* Returns the request id (> 0), or 0 when it could not be queued. */
uint64_t dsp_server_requeue_failed(dsp_server *srv, const char *type);
/* An operator's cancel of a task this dispatcher holds: a buffered one leaves its
 * queue, a delivered one gets a CANCEL frame (its slot stays taken until the worker
 * answers); either way its row becomes FAILED "cancelled" through the fenced write
 * path, and t is freed. Returns what it was: "buffered" or "running". */
const char *dsp_server_cancel_held(dsp_server *srv, dsp_task *t);

#endif
