/* internal.h: the objects of libtaskpush as its files see them: struct tp_worker,
 * struct tp_task, a submission (tpi_submit), a kept outcome (tpi_kept), the counters,
 * the connection states, and the connection's limits. Each file's functions are
 * declared in that file's own header (options.h, tls.h, output.h, pool.h, submit.h,
 * inventory.h, client.h), so that who calls whom shows in the includes. Nothing here
 * is exported from libtaskpush.so (the build hides every symbol not marked TP_API);
 * internal names start with tpi_.
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
#ifndef TASKPUSH_WC_INTERNAL_H
#define TASKPUSH_WC_INTERNAL_H

#include "taskpush.h"
#include "frame_stage.h"
#include "options.h"
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

/* Connection states. If you add one, update tpi_state_text() (client.c). */
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

    uint16_t version;            /* [const] the session version it came in */

    /* A pending EXTEND (ext_ms > 0) and PROGRESS (prog_pending) request: the task is
     * on w->ext_head while either is. [done] */
    tp_task *ext_next;
    uint32_t ext_ms;             /* 0: no EXTEND (a request of 0 ms is refused) */
    int ext_pending;             /* on the list */
    int prog_pending;
    uint16_t prog_permille;
    uint16_t prog_len;
    char prog_msg[PROTO_MAX_PROGRESS_MSG];
    tp_task *ext_taken_next; /* [io] the list tpi_done_take() returned */
    uint32_t ext_send_ms;    /* [io] ext_ms as taken by tpi_done_take(); 0: none */
    int prog_send;           /* [io] a PROGRESS to send, as taken by tpi_done_take() */
    uint16_t prog_send_permille;
    uint16_t prog_send_len;
    char prog_send_msg[PROTO_MAX_PROGRESS_MSG];

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
    char last_failure[200];    /* why the last attempt failed (submit_give_up_rounds) */
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

#endif
