/* client_internal.h: what the files of libtaskpush share, and what the unit
 * tests reach into. Nothing here is exported from libtaskpush.so (the build
 * hides every symbol not marked TP_API); internal names start with tpi_.
 *
 * Threads. One thread runs tp_worker_run() (the "I/O thread": the event base,
 * the socket, every timer, every log line). With threads > 0, handler threads
 * take tasks from the job queue and give them back through the done queue.
 * Who may touch what is written beside each field:
 *   [io]    the I/O thread only
 *   [const] set before the handler sees the task, read-only afterwards
 *   [job]   under w->job_mu         [done] under w->done_mu
 *   [hdl]   the thread running the task's handler, until it hands the task back
 *   [atomic] any thread
 */
#ifndef TASKPUSH_CLIENT_INTERNAL_H
#define TASKPUSH_CLIENT_INTERNAL_H

#include "taskpush.h"
#include "frame_stage.h"
#include "proto.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>

struct event_base;
struct event;
struct bufferevent;
struct addrinfo;
struct ssl_ctx_st;

/* Frames decoded per read callback before yielding to the loop (memcached's
 * reqs_per_event): a busy connection cannot starve the timers, and with inline
 * handlers 64 no-op tasks take microseconds. */
#define TPI_FRAMES_PER_EVENT 64
/* Bytes read from a plaintext connection per wake-up at most (client.c). */
#define TPI_READ_MAX 16384

/* Time allowed to flush the last frames (DONEs, STOP, ERROR) before closing. */
#define TPI_LINGER_MS 5000

/* A peer silent for this many heartbeat intervals is lost (docs/worker.md). */
#define TPI_HEARTBEAT_MISSES 3

/* Results at least this large are handed to the output buffer by reference
 * instead of being copied. */
#define TPI_RESULT_BY_REFERENCE 16384

/* One "host:port" of tp_worker_options.addresses. A host is a DNS name or an
 * address (an IPv6 address without its brackets). */
typedef struct tpi_addr {
    char host[256];
    char port[6];
} tpi_addr;

/* Connection states. If you add one, update tpi_state_text(). */
enum tpi_conn_state {
    TPI_IDLE = 0,   /* no connection: waiting for the reconnect timer, or stopped */
    TPI_CONNECTING, /* TCP connect in progress */
    TPI_HANDSHAKE,  /* HELLO sent, waiting for WELCOME */
    TPI_READY,      /* taking tasks */
    TPI_DRAINING,   /* STOP sent or received: finishing the deliveries held */
    TPI_CLOSING,    /* reading stopped, flushing the output, then close */
    TPI_STATE_COUNT
};

/* The counters of tp_worker_stats that only grow, defined once: the struct of
 * atomics below and the copy in tp_worker_get_stats() come from this list. */
#define TPI_COUNTERS(X)                                                                            \
    X(connect_attempts)                                                                            \
    X(connections)                                                                                 \
    X(disconnects)                                                                                 \
    X(protocol_errors)                                                                             \
    X(tasks_received)                                                                              \
    X(tasks_completed)                                                                             \
    X(tasks_dropped)                                                                               \
    X(cancels_received)                                                                            \
    X(extends_sent)                                                                                \
    X(heartbeats_sent)                                                                             \
    X(frames_received)                                                                             \
    X(read_yields)                                                                                 \
    X(tasks_carried)                                                                               \
    X(outcomes_confirmed)                                                                          \
    X(outcomes_resent)                                                                             \
    X(outcomes_forgotten)

typedef struct tpi_counters {
#define TPI_COUNTER_FIELD(name) _Atomic uint64_t name;
    TPI_COUNTERS(TPI_COUNTER_FIELD)
#undef TPI_COUNTER_FIELD
    _Atomic uint64_t in_flight; /* not a counter: set by the I/O thread */
} tpi_counters;

/* Adds one to a counter; only the I/O thread writes them, others only read. */
#define TPI_COUNT(w, name) atomic_fetch_add_explicit(&(w)->counters.name, 1, memory_order_relaxed)

/* A registered task type. */
typedef struct tpi_type {
    char name[PROTO_MAX_TYPE_LEN + 1];
    size_t len;
    tp_handler fn;
    void *arg;
} tpi_type;

struct tp_task {
    tp_worker *w;                /* [const] */
    const tpi_type *type_reg;    /* [const] its handler; NULL when none is registered */
    uint64_t id;                 /* [const] the delivery ... */
    uint32_t epoch;              /* [const] */
    uint32_t attempt;            /* [const] */
    uint32_t timeout_ms;         /* [const] */
    uint8_t priority;            /* [const] */
    uint64_t gen;                /* [const] the connection that delivered it */
    size_t max_data;             /* [const] the largest result or error the DONE can carry */
    _Atomic int64_t deadline_ns; /* [atomic] end of the lease (monotonic); INT64_MAX: none */
    atomic_int cancelled;        /* [atomic] CANCEL received or connection lost */

    /* The outcome: [hdl] while the handler runs, then [io]. */
    int outcome;
    uint32_t retry_after_ms;
    uint8_t *result;
    size_t result_len;
    size_t result_refused; /* > 0: a result of this size was refused (TP_ETOOBIG) */
    char *error;
    size_t error_len;

    /* The list of deliveries held on the current connection, for CANCEL, or (version 3)
     * the list of those carried over from an earlier one (inventory.c). [io] */
    tp_task *held_prev;
    tp_task *held_next;
    int held;
    int carried;

    tp_task *next; /* [job] in the job queue, then [done] in the done queue */

    /* A pending EXTEND request. [done] */
    tp_task *ext_next;
    uint32_t ext_ms;
    int ext_pending;
    tp_task *ext_taken_next; /* [io] the list tpi_done_take() returned */
    uint32_t ext_send_ms;    /* [io] ext_ms as taken by tpi_done_take() */

    char type[PROTO_MAX_TYPE_LEN + 1]; /* [const] */
    const uint8_t *payload;            /* [const] points into body */
    size_t payload_len;                /* [const] */
    uint8_t body[];                    /* [const] the TASK body, then a NUL byte */
};

/* An outcome sent in a version-3 session and not yet confirmed (inventory.c). [io] */
typedef struct tpi_kept {
    struct tpi_kept *prev, *next; /* in the order sent */
    uint64_t task_id;
    uint32_t epoch;
    uint32_t attempt;
    uint8_t outcome;
    uint32_t retry_after_ms;
    size_t len;
    uint8_t data[];
} tpi_kept;

/* One tp_submit() call. The caller and the I/O thread share it; whoever is last frees
 * it: the caller once `done`, the I/O thread when the caller gave up (`abandoned`). */
typedef struct tpi_submit {
    struct tpi_submit *next; /* [sub] the queue, then [io] the pending or sent list */
    uint8_t *frame;          /* [const] the SUBMIT frame; request_id is set by [io] */
    size_t frame_len;        /* [const] */
    size_t ntasks;           /* [const] */
    int wait;                /* [const] TP_SUBMIT_WAIT */
    uint32_t request_id;     /* [io] */
    uint64_t gen;            /* [io] the connection it was sent on */
    /* [sub] below */
    tp_submit_result *results; /* the caller's array */
    int done;                /* the answer is complete: the caller may return */
    int abandoned;           /* the caller returned (timeout): the I/O thread frees it */
    int acked;               /* SUBMITTED OK came; outcomes_left OUTCOMEs still due */
    size_t outcomes_left;
    int rc;
    char text[TP_ERROR_TEXT_LEN];
} tpi_submit;

struct tp_worker {
    /* Configuration, fixed while running. */
    tp_worker_options opts; /* string fields point to the copies below */
    char *addresses;
    char *name;
    char *token;
    tpi_addr *addrs;
    size_t naddrs;
    tpi_type types[PROTO_MAX_TYPES];
    size_t ntypes;
    struct ssl_ctx_st *tls_ctx; /* opts.tls: the CAs and our certificate; NULL otherwise */

    int stop_fd;        /* eventfd written by tp_worker_stop() */
    atomic_int running; /* 1 inside tp_worker_run() */
    tpi_counters counters;
    uint64_t rng; /* [io] xorshift state for the reconnect jitter */

    /* The event loop and its events. [io], valid during tp_worker_run() */
    struct event_base *base;
    struct event *stop_ev;      /* stop_fd readable */
    struct event *wake_ev;      /* wake_fd readable: the done queue or an EXTEND */
    struct event *reconnect_ev; /* reconnect backoff timer */
    struct event *hs_ev;        /* connect + WELCOME deadline */
    struct event *hb_ev;        /* heartbeat timer */
    struct event *more_ev;      /* re-armed when the frame budget ran out */
    struct event *linger_ev;    /* deadline of the flush before a close */
    struct event *stop_wait_ev; /* how long a drained stop waits for the answering STOP */
    struct event *flush_ev;     /* writes the output once per loop pass (direct_write) */
    struct event *read_ev;      /* a plaintext connection's socket readable (client.c) */
    pthread_t io_thread;
    struct tpi_loop *loop;      /* the loop of tp_worker_run_many() this worker runs in */
    int finished;               /* stopped and drained: its loop may end without it */

    /* The connection. [io] */
    enum tpi_conn_state state;
    struct bufferevent *bev;
    uint64_t gen;              /* bumped for every connection */
    size_t addr_idx;           /* the address tried now / last */
    struct addrinfo *ai_list;  /* the resolved forms of addrs[addr_idx] */
    struct addrinfo *ai_cur;   /* the one being connected */
    unsigned failures;         /* attempts since the last WELCOME, for the backoff */
    size_t round_misses;       /* hosts in a row that failed or were not leading */
    int round_not_leader;      /* one of them answered PROTO_ERR_NOT_LEADER */
    int reconnect_after_close; /* 1: schedule a reconnect when the connection closes */
    uint32_t max_body_in;      /* largest body accepted from the dispatcher */
    uint32_t max_body_out;     /* largest body the dispatcher accepts */
    size_t max_data;           /* the largest data of a DONE under max_body_out */
    uint32_t heartbeat_ms;     /* 0: no heartbeats */
    int64_t last_rx_ns;        /* when bytes last arrived */
    int64_t last_tx_ns;        /* when a frame was last queued for sending */
    int established;           /* WELCOME received on this connection */
    unsigned in_flight;        /* deliveries on this connection without a DONE */
    tp_task *held;             /* those deliveries (a doubly linked list) */
    int peer_stopped;          /* the dispatcher sent STOP */
    int64_t welcome_ns;        /* when WELCOME arrived */
    uint64_t session_tasks;    /* tasks received on this connection */
    int direct_write;          /* plaintext and connected: flush_ev writes the socket */
    int flush_queued;          /* flush_ev is active */
    proto_frame_stage stage;   /* direct_write: this pass's frames, sent by on_flush */
    char close_reason[160];    /* why a CLOSING connection closes */
    int close_level;           /* and the level of its log line */
    int stop_sent;             /* we sent STOP */

    /* Stopping. [io] */
    uint64_t stop_requests; /* tp_worker_stop() calls seen */
    int stopping;           /* graceful: no reconnect, close once drained */
    size_t tasks_alive;     /* tasks allocated and not yet freed */

    /* Handler threads. */
    pthread_t *threads; /* [io] */
    unsigned nthreads;  /* [io] started */
    pthread_mutex_t job_mu;
    pthread_cond_t job_cv;
    tp_task *job_head; /* [job] */
    tp_task *job_tail; /* [job] */
    int job_quit;      /* [job] threads exit when the queue is empty */

    /* The way back to the I/O thread. */
    int wake_fd; /* eventfd */
    pthread_mutex_t done_mu;
    tp_task *done_head; /* [done] */
    tp_task *done_tail; /* [done] */
    tp_task *ext_head;  /* [done] tasks with an EXTEND to send */
    int wake_pending;   /* [done] wake_fd was written and not yet read */

    /* Submissions (submit.c). */
    pthread_mutex_t sub_mu;
    pthread_cond_t sub_cv;    /* CLOCK_MONOTONIC; broadcast when one is done */
    tpi_submit *sub_head;     /* [sub] from tp_submit(), not yet taken by the I/O thread */
    tpi_submit **sub_tail;    /* [sub] */
    tpi_submit *sub_pending;  /* [io] taken, waiting for a connection of version 2 */
    tpi_submit *sub_sent;     /* [io] sent, waiting for SUBMITTED or OUTCOMEs */
    uint32_t next_request_id; /* [io] */
    uint16_t hello_version;   /* [io] the version the next HELLO speaks (2, or 1 after an
                               * old dispatcher refused 2) */
    uint16_t session_version; /* [io] the version of the current WELCOME */

    /* Inventory (version 3, inventory.c). [io] */
    tp_task *carried;         /* tasks still running from an earlier connection */
    unsigned ncarried;
    tpi_kept *kept_head;      /* outcomes sent and not yet confirmed, oldest first */
    tpi_kept *kept_tail;
    size_t nkept;
    tpi_kept *kept_spare; /* confirmed small records, for the next DONEs */
    size_t nkept_spare;
};

/* ---- options.c ---- */

/* Fills *err (when not NULL) with code and a formatted reason; returns code. */
int tpi_error_set(tp_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copies the fields of in that its version knows into out, defaults for the
 * rest; returns 0, or TP_EINVAL (NULL, unknown version) with the reason in *err. */
int tpi_options_copy(const tp_worker_options *in, tp_worker_options *out, tp_error *err);

/* Checks every field of opts (a copy made by tpi_options_copy); returns 0 or
 * TP_EINVAL with the reason in *err. */
int tpi_options_check(const tp_worker_options *opts, tp_error *err);

/* Parses "host:port[,host:port...]" into a new array (caller frees) of *n
 * entries. Returns 0, TP_EINVAL with the reason in *err, or TP_ENOMEM. */
int tpi_addr_parse(const char *list, tpi_addr **out, size_t *n, tp_error *err);

/* The delay before reconnect attempt number failures (0 for the first after a
 * success): min * 2^failures capped at max, with "equal jitter" (between half
 * of it and all of it), drawn from *rng. */
uint32_t tpi_backoff_ms(uint64_t *rng, uint32_t min, uint32_t max, unsigned failures);

/* Advances a xorshift64* generator; the state must not be 0. */
uint64_t tpi_rand(uint64_t *state);

/* The monotonic clock in nanoseconds. */
int64_t tpi_now_ns(void);

/* ---- tls.c ---- */

/* Makes the TLS context of opts (opts->tls set): the CAs to trust, and the
 * certificate to present. Returns 0 and *out (free with tpi_tls_ctx_free), or
 * TP_EINVAL / TP_ENOMEM with the reason (naming the field and file) in *err. */
int tpi_tls_ctx_new(const tp_worker_options *opts, struct ssl_ctx_st **out, tp_error *err);
void tpi_tls_ctx_free(struct ssl_ctx_st *ctx);

/* A bufferevent, not yet connected (bufferevent_socket_connect does that),
 * that runs the client side of a handshake and refuses a certificate that
 * does not name host (a DNS name or an IP address). A close without
 * close_notify reads as EOF. NULL on failure. [io] */
struct bufferevent *tpi_tls_bev_new(struct event_base *base, struct ssl_ctx_st *ctx,
                                    const char *host);

/* When bev failed in TLS, writes "TLS: reason" (with why a certificate was
 * refused) into buf and returns 1; else returns 0. [io] */
int tpi_tls_error_text(struct bufferevent *bev, char *buf, size_t len);

/* ---- client.c ---- */

/* Formats a line and passes it to the log callback. [io] Use tpi_log(), which
 * checks the level before anything is formatted. */
void tpi_log_write(tp_worker *w, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define tpi_log(w, lvl, ...)                                                                       \
    do {                                                                                           \
        if ((w)->opts.log != NULL && (lvl) <= (w)->opts.log_level)                                 \
            tpi_log_write((w), (lvl), __VA_ARGS__);                                                \
    } while (0)

const char *tpi_state_text(enum tpi_conn_state s);

/* ---- pool.c ---- */

/* Runs a task's handler (or answers it without one) and fills its outcome. [hdl] */
void tpi_task_execute(tp_task *t);

/* Starts opts.threads handler threads; returns 0 or TP_ESYS. [io] */
int tpi_pool_start(tp_worker *w);

/* Lets the threads finish the queue, then joins them. [io] */
void tpi_pool_join(tp_worker *w);

/* Queues a task for the handler threads. [io] */
void tpi_pool_submit(tp_worker *w, tp_task *t);

/* Gives a task whose handler returned back to the I/O thread. [hdl] */
void tpi_done_push(tp_worker *w, tp_task *t);

/* Takes the done queue (linked by next) and the EXTEND requests (linked by
 * ext_taken_next, since a handler may queue a new request meanwhile) at once,
 * under done_mu. Process *ext first: an EXTEND in it was queued before its
 * task's DONE, and the task lives until that DONE is processed. [io] */
void tpi_done_take(tp_worker *w, tp_task **done, tp_task **ext);

/* Frees a task and its outcome. */
void tpi_task_free(tp_task *t);

/* ---- client.c: the output ---- */

/* Queues len bytes for the dispatcher, in the stage or the bufferevent's output (TLS, not
 * yet connected, a large frame, no memory). Returns 0 or -1. [io] */
int tpi_write(tp_worker *w, const void *data, size_t len);

/* ---- submit.c ---- */

/* Sets up / tears down the submission state (tp_worker_new / tp_worker_free). */
int tpi_submit_init(tp_worker *w);
void tpi_submit_destroy(tp_worker *w);
/* Takes the queue and sends what a version-2 session can carry. [io] */
void tpi_submit_flush(tp_worker *w);
/* A SUBMITTED or OUTCOME frame. [io] */
void tpi_submit_on_submitted(tp_worker *w, const proto_submitted *s);
void tpi_submit_on_outcome(tp_worker *w, const proto_outcome_msg *o);
/* The connection closed: what was sent gets TP_EGONE. [io] */
void tpi_submit_conn_lost(tp_worker *w);
/* tp_worker_run() ends: everything queued or pending gets TP_EGONE. [io] */
void tpi_submit_fail_all(tp_worker *w, const char *why);
/* Sent submissions still waiting for SUBMITTED (a drain waits for them). [io] */
int tpi_submit_unanswered(const tp_worker *w);

/* ---- inventory.c ---- */

/* Keeps a copy of a DONE until a CONFIRM names it; beyond 4 x capacity + 1024 kept, the
 * oldest is forgotten (and logged). */
void tpi_inv_keep(tp_worker *w, const proto_done *d);
/* A CONFIRM: forgets the outcomes it names. */
void tpi_inv_on_confirm(tp_worker *w, const proto_dlv_list *l);
/* A version-3 connection was lost: its held deliveries go on running, carried. */
void tpi_inv_carry(tp_worker *w);
/* t's handler returned: it leaves the carried list (no-op when not on it). */
void tpi_inv_uncarry(tp_worker *w, tp_task *t);
/* The carried task of that delivery, or NULL. */
tp_task *tpi_inv_find_carried(tp_worker *w, uint64_t id, uint32_t epoch, uint32_t attempt);
/* Stopping, or a session older than version 3: carried tasks are cancelled (their
 * outcomes will be dropped), kept outcomes forgotten. */
void tpi_inv_abandon(tp_worker *w);
/* After WELCOME: in version 3, HOLDING for the carried tasks, then every kept outcome
 * again; in older versions, tpi_inv_abandon. Returns 0, or -1 when it cannot be queued. */
int tpi_inv_session_start(tp_worker *w);
/* tp_worker_run() ends: frees what is kept (the tasks themselves are freed elsewhere). */
void tpi_inv_free(tp_worker *w);

/* ---- client.c, for task.c ---- */

/* Sends an EXTEND for t now (on the I/O thread). */
void tpi_conn_send_extend(tp_worker *w, tp_task *t, uint32_t ms);

/* Queues an EXTEND request for the I/O thread. [hdl] or any thread */
void tpi_extend_push(tp_worker *w, tp_task *t, uint32_t ms);

#endif
