/**
 * @file taskpush.h
 * @brief libtaskpush: the worker side of the taskpush dispatcher protocol.
 *
 * A worker connects to a `taskpushd` over TCP (or TLS: tp_worker_options.tls),
 * says which task types it takes and how many deliveries it may hold at once,
 * and then receives tasks pushed to it. For each task the library calls the handler registered for its type
 * and sends the handler's outcome back to the dispatcher.
 *
 * Typical use:
 *
 *     tp_worker_options opts;
 *     tp_worker_options_init(&opts);
 *     opts.addresses = "127.0.0.1:7070";
 *     opts.capacity = 4;
 *     opts.threads = 4;
 *     tp_error err;
 *     tp_worker *w = tp_worker_new(&opts, &err);
 *     if (w == NULL) { fprintf(stderr, "%s\n", err.text); ... }
 *     if (tp_worker_add_type(w, "resize", resize_handler, NULL) < 0) ...
 *     if (tp_worker_run(w) < 0) ...          // until tp_worker_stop(w)
 *     tp_worker_free(w);
 *
 * Conventions.
 * - Functions that can fail return 0 or a negative TP_E* code (see
 *   tp_strerror()), or NULL; they are marked TP_WARN_UNUSED.
 * - Strings passed in are copied unless a function says otherwise; pointers
 *   handed out by the library are borrowed for the time the function states.
 * - The library never prints and never exits: diagnostics go to the log
 *   callback of tp_worker_options. It keeps no global mutable state, so several
 *   workers may run in one process, each tp_worker_run() on its own thread.
 * - Delivery is at least once: a task whose connection is lost before its
 *   outcome reached the dispatcher is delivered again (possibly to another
 *   worker), and the outcome computed here is dropped. Use tp_task_epoch() and
 *   tp_task_attempt() to fence side effects.
 */
#ifndef TASKPUSH_H
#define TASKPUSH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks a function exported from libtaskpush.so (the build hides the rest). */
#if defined(__GNUC__)
#define TP_API __attribute__((visibility("default")))
#else
#define TP_API
#endif

/** Marks a fallible call whose result must be checked. */
#if defined(__GNUC__)
#define TP_WARN_UNUSED __attribute__((warn_unused_result))
#else
#define TP_WARN_UNUSED
#endif

/** Error codes: every fallible call returns 0 (TP_OK) or one of these. */
enum tp_errcode {
    TP_OK = 0,
    TP_EINVAL = -1,  /**< an argument or option is invalid */
    TP_ENOMEM = -2,  /**< out of memory */
    TP_ESYS = -3,    /**< a system call failed (the log callback has the detail) */
    TP_EBUSY = -4,   /**< not allowed while tp_worker_run() is running */
    TP_EEXIST = -5,  /**< a handler is already registered for this type */
    TP_ERANGE = -6,  /**< a count or length exceeds its limit */
    TP_ETOOBIG = -7, /**< a result larger than the dispatcher accepts */
    TP_EGONE = -8,   /**< the delivery was cancelled or its connection lost */
    TP_EUNAVAIL = -9,   /**< the dispatcher cannot take a submission now (not leading,
                             database down, protocol version 1): nothing was committed */
    TP_ETIMEDOUT = -10, /**< no answer within the time allowed */
    TP_ENOTSUP = -11,   /**< the dispatcher's protocol version lacks it (PROGRESS needs 4):
                             nothing was sent (library 1.4) */
};

/** What a handler returns: the outcome of one delivery. */
enum tp_outcome {
    TP_SUCCESS = 0,        /**< done; the result (tp_task_set_result()) is stored */
    TP_FAIL = 1,           /**< failed attempt: retried with backoff until max_attempts */
    TP_FAIL_PERMANENT = 2, /**< failed for good: never retried */
    TP_RETRY_AFTER = 3,    /**< failed attempt, retried after tp_task_set_retry_after() ms */
};

/** Log levels, most severe first. */
enum tp_log_level {
    TP_LOG_ERROR = 0,
    TP_LOG_WARN = 1,
    TP_LOG_INFO = 2,
    TP_LOG_DEBUG = 3,
};

/** Limits. */
#define TP_MAX_CAPACITY 65536u  /**< largest tp_worker_options.capacity */
#define TP_MAX_THREADS 1024u    /**< largest tp_worker_options.threads */
#define TP_MAX_ADDRESSES 32u    /**< addresses in tp_worker_options.addresses */
#define TP_MAX_TYPES 64u        /**< task types per worker (the protocol's limit) */
#define TP_MAX_TYPE_LEN 256u    /**< bytes of one task type (VARCHAR(64) utf8mb4) */
#define TP_MAX_NAME_LEN 256u    /**< bytes of a worker name */
#define TP_MAX_TOKEN_LEN 1024u  /**< bytes of the shared secret */
#define TP_MAX_ERROR_LEN 65535u /**< error texts are cut to this many bytes (a TEXT column) */
#define TP_ERROR_TEXT_LEN 192u  /**< size of tp_error.text */

/** A worker: one connection (at a time) to a dispatcher, its handlers and threads. Opaque. */
typedef struct tp_worker tp_worker;

/** One delivery of a task to this worker, passed to a handler. Opaque. */
typedef struct tp_task tp_task;

/** Details of a failed call, filled when the caller passes one (it is optional). */
typedef struct tp_error {
    int code;                     /**< the TP_E* code that was returned */
    char text[TP_ERROR_TEXT_LEN]; /**< a one-line, NUL-terminated explanation */
} tp_error;

/**
 * A log sink.
 * @param arg   tp_worker_options.log_arg
 * @param level one of enum tp_log_level
 * @param msg   one line without a trailing newline; borrowed until the callback returns
 *
 * Called only on the thread running tp_worker_run(), and only for levels up to
 * tp_worker_options.log_level (the library checks before formatting).
 */
typedef void (*tp_log_fn)(void *arg, int level, const char *msg);

/**
 * A task handler.
 * @param task the delivery; borrowed until the handler returns (do not keep it)
 * @param arg  the pointer given to tp_worker_add_type()
 * @return one of enum tp_outcome. Any other value counts as TP_FAIL.
 *
 * With tp_worker_options.threads == 0 handlers run on the thread running
 * tp_worker_run(), one at a time, and block the connection while they run (no
 * heartbeats, no CANCEL): fine for handlers that take microseconds. Otherwise
 * they run on the worker's handler threads, up to `threads` at a time.
 */
typedef int (*tp_handler)(tp_task *task, void *arg);

/** The version of tp_worker_options this header describes: 1 is the fields
 *  up to log_arg, 2 adds the TLS fields, 3 submit_give_up_rounds. */
#define TP_OPTIONS_VERSION 3u

/**
 * Options of tp_worker_new(). Always initialise with tp_worker_options_init(),
 * then set the fields you need: later versions only append fields, and the
 * version field tells the library which ones the caller knows (a program
 * built against an older header keeps working, with defaults for the rest).
 */
typedef struct tp_worker_options {
    unsigned version; /**< set by tp_worker_options_init(); do not change */
    /** Dispatchers to connect to, "HOST:PORT[,HOST:PORT...]" (IPv6 as "[::1]:7070"),
     *  tried in turn. Required. Copied by tp_worker_new(). */
    const char *addresses;
    /** The worker's name as the dispatcher shows it. NULL: "HOSTNAME:PID". Copied. */
    const char *name;
    /** The dispatcher's shared secret. NULL or "": none. Copied. */
    const char *token;
    /** Deliveries held at once (1 .. TP_MAX_CAPACITY). Default 1. */
    unsigned capacity;
    /** Handler threads (0 .. TP_MAX_THREADS); 0 runs handlers inline on the I/O
     *  thread (see tp_handler). Usually equal to capacity. Default 0. */
    unsigned threads;
    /** First delay before reconnecting, in ms (>= 1). Default 100. */
    unsigned reconnect_min_ms;
    /** Longest delay before reconnecting, in ms (>= reconnect_min_ms). Default 5000.
     *  The delay doubles after each failed attempt, with jitter. */
    unsigned reconnect_max_ms;
    /** Time allowed to connect and receive WELCOME, in ms (>= 1). Default 5000. */
    unsigned connect_timeout_ms;
    /** Most verbose level passed to log (enum tp_log_level). Default TP_LOG_INFO. */
    int log_level;
    /** Where diagnostics go; NULL discards them. Default NULL. */
    tp_log_fn log;
    /** First argument of log. */
    void *log_arg;

    /* Version 2. */
    /** Nonzero: speak TLS to the dispatcher (`taskpushd --tls-cert`). The
     *  dispatcher's certificate must chain to a CA of tls_ca_file and name the
     *  host of the address connected to (a DNS name, or an IP address as an IP
     *  subjectAltName); otherwise the attempt fails, is logged, and the worker
     *  retries with backoff as for any failed connect. Default 0. */
    int tls;
    /** PEM file of the CAs trusted for the dispatcher's certificate. NULL: the
     *  system's default CA paths. Only with tls. Read by tp_worker_new(). */
    const char *tls_ca_file;
    /** PEM file of the certificate chain this worker presents (needed when the
     *  dispatcher runs with `--tls-ca`). NULL: none. Only with tls and
     *  tls_key_file. Read by tp_worker_new(). */
    const char *tls_cert_file;
    /** PEM file of the private key of tls_cert_file. Read by tp_worker_new(). */
    const char *tls_key_file;

    /* Version 3. */
    /** For a one-shot producer (a command-line tool): once this many rounds in a
     *  row over every address have failed to connect (refused, unreachable, not a
     *  dispatcher's worker port, not leading; no WELCOME), tp_submit() calls waiting
     *  for a connection end with TP_EUNAVAIL and the last attempt's reason instead of
     *  waiting out their timeout. The worker keeps reconnecting. 0 (default): they
     *  wait for a connection. Since library version 1.2. */
    unsigned submit_give_up_rounds;
} tp_worker_options;

/**
 * Counters of one worker, for tests and monitoring. Fields are only ever
 * appended; tp_worker_get_stats() copies as many as the caller's struct holds.
 */
typedef struct tp_worker_stats {
    uint64_t connect_attempts; /**< TCP connects started */
    uint64_t connections;      /**< handshakes completed (WELCOME received) */
    uint64_t disconnects;      /**< established connections (after WELCOME) closed or lost */
    uint64_t protocol_errors;  /**< connections closed for a bad or unexpected frame */
    uint64_t tasks_received;   /**< TASK frames */
    uint64_t tasks_completed;  /**< DONE frames queued for the dispatcher */
    uint64_t tasks_dropped;    /**< outcomes dropped because their connection was gone */
    uint64_t cancels_received; /**< CANCEL frames that named a delivery held here */
    uint64_t extends_sent;     /**< EXTEND frames */
    uint64_t heartbeats_sent;  /**< HEARTBEAT frames sent */
    uint64_t frames_received;  /**< every frame decoded */
    uint64_t read_yields;      /**< reads that stopped at the per-event frame budget */
    uint64_t in_flight;        /**< deliveries held now on the current connection */
    /* Protocol version 3 (docs/worker.md, "Across a failover"): */
    uint64_t tasks_carried;      /**< deliveries kept running across a lost connection */
    uint64_t outcomes_confirmed; /**< outcomes the dispatcher confirmed (CONFIRM) */
    uint64_t outcomes_resent;    /**< unconfirmed outcomes sent again after a reconnect */
    uint64_t outcomes_forgotten; /**< unconfirmed outcomes dropped beyond the bound */
} tp_worker_stats;

/**
 * Describes an error code.
 * @param code 0 or a TP_E* value
 * @return a static string ("unknown error" for other values). Thread-safe.
 */
TP_API const char *tp_strerror(int code);

/**
 * @return the library's version string (static). Thread-safe.
 */
TP_API const char *tp_version(void);

/**
 * Fills opts with the defaults listed in tp_worker_options and sets its version.
 * @param opts the struct to fill (not NULL)
 * Thread-safe.
 */
TP_API void tp_worker_options_init(tp_worker_options *opts);

/**
 * Creates a worker. Nothing connects before tp_worker_run().
 * @param opts options, initialised by tp_worker_options_init(); copied (strings
 *             too), so they may be freed after the call
 * @param err  optional (NULL): filled with the code and a one-line reason on failure
 * @return the worker (free with tp_worker_free()), or NULL: TP_EINVAL for bad
 *         options (e.g. an address that does not parse, or a TLS file that
 *         cannot be read or is not PEM), TP_ENOMEM, TP_ESYS.
 * Thread-safe (touches no shared state).
 */
TP_API tp_worker *tp_worker_new(const tp_worker_options *opts, tp_error *err) TP_WARN_UNUSED;

/**
 * Registers the handler of one task type. The HELLO sent to the dispatcher
 * lists every registered type.
 * @param w    the worker; not running
 * @param type the task type, 1 .. TP_MAX_TYPE_LEN bytes, compared byte for byte; copied
 * @param fn   the handler (not NULL)
 * @param arg  passed to fn as is; owned by the caller, who keeps it alive while w runs
 * @return 0; TP_EINVAL (NULL argument, empty type), TP_ERANGE (type too long, or
 *         TP_MAX_TYPES reached), TP_EEXIST (type already registered), TP_EBUSY
 *         (w is running), TP_ENOMEM.
 * Not thread-safe: call before tp_worker_run(), from one thread.
 */
TP_API int tp_worker_add_type(tp_worker *w, const char *type, tp_handler fn,
                              void *arg) TP_WARN_UNUSED;

/**
 * Runs the worker on the calling thread until tp_worker_stop(): connects,
 * receives tasks, runs handlers, reconnects with backoff when the connection is
 * lost. Starts the handler threads on entry and joins them before returning,
 * so it returns only once every handler has returned.
 *
 * SIGPIPE: for the duration of the call, SIGPIPE is blocked in the calling
 * thread (pthread_sigmask) and so in the handler threads, which inherit the
 * mask; a write to a closed socket or pipe then fails with EPIPE instead of
 * killing the process. Before returning, a SIGPIPE left pending in the calling
 * thread is consumed (sigtimedwait) and the previous mask is restored.
 *
 * @param w the worker; with no type registered it is a producer-only client (it
 *          connects and serves tp_submit(), and receives no task)
 * @return 0 after tp_worker_stop(); TP_EINVAL (w is NULL), TP_EBUSY
 *         (already running), TP_ENOMEM or TP_ESYS when the event loop or the
 *         threads cannot be set up. Never fails because of the network.
 * Thread-safety: one tp_worker_run() per worker at a time; different workers
 * may run concurrently on different threads. May be called again after it returned.
 */
TP_API int tp_worker_run(tp_worker *w) TP_WARN_UNUSED;

/**
 * Runs n workers on the calling thread, on one event loop, until each of them
 * was stopped: tp_worker_run() for several at once (it is this call with n = 1).
 * For a process that holds many connections, e.g. a load generator, or one worker
 * per dispatcher shard: the thread wakes once for all the connections with
 * something to read, where n threads running tp_worker_run() wake one by one.
 * Each worker keeps its own connection, capacity, handler threads and counters;
 * one stopped early waits, idle, for the others. A handler run inline (threads 0)
 * holds up every worker of the call while it runs, and must not call tp_submit()
 * on any of them.
 *
 * @param ws the workers, none NULL, none twice (the array is read at the call only)
 * @param n  how many (>= 1)
 * @return as tp_worker_run(): 0 once all were stopped; TP_EINVAL (ws NULL, n 0, a
 *         NULL worker), TP_EBUSY (one is running, or named twice: none is run),
 *         TP_ENOMEM or TP_ESYS.
 * Since library version 1.1.
 */
TP_API int tp_worker_run_many(tp_worker *const *ws, size_t n) TP_WARN_UNUSED;

/**
 * Asks a worker to stop, gracefully: it sends STOP (no more tasks), lets the
 * handlers finish the deliveries it holds (including queued ones), sends their
 * outcomes, flushes, closes the connection and makes tp_worker_run() return.
 * A second call stops at once instead: the connection is closed, the
 * deliveries held are marked cancelled (tp_task_cancelled()) and their
 * outcomes dropped (the dispatcher redelivers them); tp_worker_run() still
 * waits for running handlers to return.
 * A call made before tp_worker_run() makes the next run return at once.
 *
 * @param w the worker (not freed)
 * Thread-safe and async-signal-safe (it only writes to an eventfd and keeps
 * errno): it may be called from a signal handler or from a task handler.
 */
TP_API void tp_worker_stop(tp_worker *w);

/**
 * Frees a worker and everything it owns.
 * @param w the worker, not running; NULL does nothing
 * Not thread-safe: no other call on w may be in progress or follow.
 */
TP_API void tp_worker_free(tp_worker *w);

/**
 * Copies the worker's counters.
 * @param w    the worker
 * @param out  where to copy them
 * @param size sizeof(*out) as the caller compiled it; fields beyond it are not written
 * @return 0, or TP_EINVAL for a NULL argument.
 * Thread-safe: may be called while tp_worker_run() runs; each counter is read
 * atomically, the set is not a snapshot.
 */
TP_API int tp_worker_get_stats(const tp_worker *w, tp_worker_stats *out, size_t size);

/**
 * @return the task's id (task_id in the table). Thread-safe while the handler runs.
 */
TP_API uint64_t tp_task_id(const tp_task *task);

/**
 * @return the task's type as a NUL-terminated string; borrowed until the handler
 *         returns. Thread-safe while the handler runs.
 */
TP_API const char *tp_task_type(const tp_task *task);

/**
 * The task's payload, byte for byte as the producer inserted it.
 * @param task the task
 * @param len  optional (NULL): receives the payload's length in bytes
 * @return the payload, borrowed until the handler returns; never NULL, and
 *         followed by a NUL byte not counted in *len (so a text payload can be
 *         used as a C string). Thread-safe while the handler runs.
 */
TP_API const void *tp_task_payload(const tp_task *task, size_t *len);

/**
 * @return the delivery's attempt number, 1 for the first delivery.
 * A redelivery of the same task has a larger attempt. Thread-safe.
 */
TP_API uint32_t tp_task_attempt(const tp_task *task);

/**
 * @return the epoch of the dispatcher that delivered the task; together with
 * the id and the attempt it names the delivery, and can fence side effects
 * (ignore a write whose (epoch, attempt) is older than one already applied).
 * Thread-safe.
 */
TP_API uint32_t tp_task_epoch(const tp_task *task);

/**
 * @return the lease of the delivery in ms as the dispatcher sent it (0: none).
 * After that the dispatcher may give the task to another worker. Thread-safe.
 */
TP_API uint32_t tp_task_timeout_ms(const tp_task *task);

/**
 * @return the task's priority: 0 LOW, 1 NORMAL, 2 HIGH. Thread-safe.
 */
TP_API int tp_task_priority(const tp_task *task);

/**
 * @return milliseconds left before the lease ends, by this host's monotonic
 * clock from the moment the task arrived, moved by tp_task_extend(); zero or
 * negative once it has ended; INT64_MAX when the task has no lease.
 * Thread-safe while the handler runs.
 */
TP_API int64_t tp_task_remaining_ms(const tp_task *task);

/**
 * Sets the result stored with a successful outcome. A later call replaces it.
 * @param task the task, from its handler
 * @param data the bytes (may be NULL when len is 0); copied
 * @param len  their number
 * @return 0; TP_ETOOBIG when the DONE frame would exceed the largest body the
 *         dispatcher accepts (the outcome TP_SUCCESS then becomes a permanent
 *         failure unless a later call succeeds); TP_EINVAL; TP_ENOMEM.
 * Not thread-safe: call from the handler's thread, before it returns.
 */
TP_API int tp_task_set_result(tp_task *task, const void *data, size_t len) TP_WARN_UNUSED;

/**
 * Sets the error text stored with a failed outcome (TP_FAIL, TP_FAIL_PERMANENT,
 * TP_RETRY_AFTER). A later call replaces it.
 * @param task the task, from its handler
 * @param msg  NUL-terminated text; copied, cut to TP_MAX_ERROR_LEN bytes (at a
 *             UTF-8 character boundary) and to what the dispatcher accepts
 * @return 0; TP_EINVAL; TP_ENOMEM.
 * Not thread-safe: call from the handler's thread, before it returns.
 */
TP_API int tp_task_set_error(tp_task *task, const char *msg) TP_WARN_UNUSED;

/**
 * Sets how long the dispatcher should wait before the next attempt when the
 * handler returns TP_RETRY_AFTER (default 0: at once).
 * @param task the task, from its handler
 * @param ms   the delay in milliseconds
 * Not thread-safe: call from the handler's thread, before it returns.
 */
TP_API void tp_task_set_retry_after(tp_task *task, uint32_t ms);

/**
 * Asks the dispatcher to extend the delivery's lease to ms from now (an EXTEND
 * frame), so that a long task is not given to another worker.
 * @param task the task; only until its handler returns
 * @param ms   the new lease, from now, in ms (>= 1)
 * @return 0 (queued for the I/O thread, which sends it); TP_EGONE when the
 *         delivery was cancelled or its connection lost (the lease cannot be
 *         saved: the handler should give up); TP_EINVAL for ms == 0.
 * Thread-safe: may be called from any thread while the handler runs.
 */
TP_API int tp_task_extend(tp_task *task, uint32_t ms) TP_WARN_UNUSED;

#define TP_PROGRESS_MAX 1000u          /**< largest tp_task_progress() value: permille */
#define TP_MAX_PROGRESS_MSG_LEN 256u   /**< bytes of a tp_task_progress() message */

/**
 * Reports how far the handler is with the delivery (a PROGRESS frame, protocol
 * version 4): `taskpushctl show`, the admin port's /task and the dashboard show the
 * latest report, and the dispatcher writes it to the database at most once a second.
 * Never blocks on the network: the report is queued for the I/O thread, and a report
 * not yet sent is replaced by a newer one (only the latest value goes out).
 * @param task     the task; only until its handler returns
 * @param permille 0 .. TP_PROGRESS_MAX (1000 = done)
 * @param msg      NULL, or a NUL-terminated UTF-8 text of at most
 *                 TP_MAX_PROGRESS_MSG_LEN bytes (e.g. "page 3 of 10")
 * @return 0 (queued); TP_ENOTSUP when the dispatcher that sent the task speaks a
 *         protocol version below 4 (nothing is sent; the task is unaffected);
 *         TP_EGONE when the delivery was cancelled or its connection lost;
 *         TP_ERANGE for permille > 1000 or a longer message; TP_EINVAL for a NULL
 *         task or a message that is not UTF-8.
 * Thread-safe: may be called from any thread while the handler runs. Since 1.4. Its
 * result may be ignored: progress is advisory (no warn_unused_result, unlike extend).
 */
TP_API int tp_task_progress(tp_task *task, unsigned permille, const char *msg);

/**
 * Tells whether the delivery was abandoned: the dispatcher sent CANCEL for it
 * (its lease expired), the connection it came on was lost, or the worker is
 * stopping at once (second tp_worker_stop()). A handler that sees it should stop
 * early; its outcome is still sent (and ignored) or dropped.
 * @return 1 once abandoned, else 0.
 * Thread-safe while the handler runs. With threads == 0 it changes only
 * between handlers, since the I/O thread is busy running the handler.
 */
TP_API int tp_task_cancelled(const tp_task *task);

/* ---- Submitting tasks through the dispatcher (protocol version 2) ---- */

#define TP_MAX_SUBMIT_TASKS 1000u  /**< tasks in one tp_submit() */
#define TP_MAX_DEDUP_KEY_LEN 191u  /**< bytes of a dedup_key (VARBINARY(191)) */
#define TP_MAX_GROUP_KEY_LEN 191u  /**< bytes of a group_key (VARBINARY(191)) */
#define TP_MAX_PAYLOAD_LEN 16777215u /**< bytes of a payload (MEDIUMBLOB) */
#define TP_MAX_ATTEMPTS 1000u      /**< largest max_attempts */

/** tp_submit() flag: wait for each inserted task's final state (its OUTCOME). */
#define TP_SUBMIT_WAIT 1u

/** Final states of a task, as the table's task_state. */
#define TP_TASK_SUCCESSFUL 2
#define TP_TASK_FAILED 3

/**
 * One task to submit. Initialise with tp_submit_task_init(); the pointers are
 * borrowed for the duration of tp_submit() only.
 */
typedef struct tp_submit_task {
    /** The task type, NUL-terminated, 1 .. TP_MAX_TYPE_LEN bytes of UTF-8 (at most
     *  64 characters, not ending with a space). Required. */
    const char *type;
    const void *payload;   /**< the payload bytes (NULL when payload_len is 0) */
    size_t payload_len;    /**< 0 .. TP_MAX_PAYLOAD_LEN */
    /** Idempotency key, 0 .. TP_MAX_DEDUP_KEY_LEN bytes (dedup_key_len 0: none). While a
     *  row with this key exists, the task is answered as a duplicate instead. */
    const void *dedup_key;
    size_t dedup_key_len;
    int priority;          /**< 0 LOW, 1 NORMAL (default), 2 HIGH */
    unsigned max_attempts; /**< 1 .. TP_MAX_ATTEMPTS; 0 (default): the table's default (3) */
    uint32_t delay_ms;     /**< not dispatched before this many ms from the insert */
    uint32_t timeout_ms;   /**< the lease of one attempt (1 .. 2^31-1); 0: the dispatcher's */
} tp_submit_task;

/** What became of one submitted task. */
typedef struct tp_submit_result {
    uint64_t task_id; /**< the new row's id; for a duplicate, the existing row's (0: unknown) */
    int duplicate;    /**< 1: its dedup_key was already present, nothing was inserted */
    /** With TP_SUBMIT_WAIT, for an inserted task: TP_TASK_SUCCESSFUL or TP_TASK_FAILED
     *  once its final state is written; 0 when not known (duplicate, no wait, timeout). */
    int state;
    void *output;      /**< the result (SUCCESSFUL) or err_msg (FAILED), malloc'd, NUL-
                            terminated (not counted); free with tp_submit_results_free() */
    size_t output_len;
} tp_submit_result;

/**
 * Fills t with the defaults (priority 1, everything else 0 or NULL).
 * Thread-safe.
 */
TP_API void tp_submit_task_init(tp_submit_task *t);

/**
 * Inserts tasks through the dispatcher the worker is connected to, and waits for the
 * answer: it comes only after the rows are committed. The worker needs no handler for
 * these types; a worker with no type at all is a producer-only client (it receives no
 * task). Synchronous: the calling thread blocks; the worker's I/O thread (the one in
 * tp_worker_run()) sends the frame and reads the answer, so tp_worker_run() must be
 * running (on another thread) or start within timeout_ms.
 * @param w       the worker
 * @param tasks   n tasks, 1 .. TP_MAX_SUBMIT_TASKS; all are inserted or none
 * @param n       their number
 * @param flags   0 or TP_SUBMIT_WAIT: also wait until every inserted task is
 *                SUCCESSFUL or FAILED (a foreground job)
 * @param timeout_ms how long to wait in all (>= 1)
 * @param results n entries filled in the order of tasks; with TP_SUBMIT_WAIT free
 *                them with tp_submit_results_free() (harmless without)
 * @param err     optional: the code and a one-line reason (the dispatcher's for INVALID)
 * @return 0 (every task inserted or a duplicate); TP_EINVAL (a bad argument, or the
 *         dispatcher refused a task: err says which and why; nothing inserted);
 *         TP_EUNAVAIL (the dispatcher cannot insert now; nothing committed: resend);
 *         TP_ETOOBIG (the frame exceeds the dispatcher's WELCOME.max_body);
 *         TP_EGONE (the connection was lost before the answer: the tasks may or may
 *         not be committed, resend with dedup keys to be safe; or, with
 *         TP_SUBMIT_WAIT, lost while waiting for outcomes: results have the ids);
 *         TP_ETIMEDOUT (results may have the ids when only the outcomes were missing);
 *         TP_EBUSY (called on the I/O thread: from a handler with threads == 0, or a
 *         log callback); TP_ENOMEM.
 * Thread-safe: any thread but the I/O thread, several at once; from a handler when
 * tp_worker_options.threads > 0.
 */
TP_API int tp_submit(tp_worker *w, const tp_submit_task *tasks, size_t n, unsigned flags,
                     unsigned timeout_ms, tp_submit_result *results, tp_error *err) TP_WARN_UNUSED;

/**
 * A task's group_key (fair share, docs/producers.md): within one type and priority the
 * dispatcher hands out the tasks of different keys in turn, so one key's backlog does
 * not hold up the others.
 */
typedef struct tp_group_key {
    const void *key; /**< the bytes (NULL when len is 0) */
    size_t len;      /**< 0 .. TP_MAX_GROUP_KEY_LEN; 0: no key */
} tp_group_key;

/**
 * tp_submit() with a group_key per task: keys[i] for tasks[i] (keys NULL: none at
 * all, the same as tp_submit()). A call where every key is empty sends the frame
 * tp_submit() sends; a keyed one needs a taskpushd of schema version 8 or later (an
 * older one refuses the frame and closes the connection).
 * @return as tp_submit(); TP_ERANGE also for a key longer than TP_MAX_GROUP_KEY_LEN,
 *         TP_EINVAL for a NULL key with a length (nothing is sent).
 * Thread-safe as tp_submit().
 */
TP_API int tp_submit_keyed(tp_worker *w, const tp_submit_task *tasks, const tp_group_key *keys,
                           size_t n, unsigned flags, unsigned timeout_ms,
                           tp_submit_result *results, tp_error *err) TP_WARN_UNUSED;

/** Task ids one submitted task may wait for (tp_submit_after()). */
#define TP_MAX_AFTER 1000u

/**
 * The tasks one submitted task waits for (dependencies, docs/producers.md): it is
 * dispatched only once every one of them is SUCCESSFUL, and ends FAILED with an err_msg
 * starting "dependency" when one of them ends FAILED.
 */
typedef struct tp_task_after {
    const uint64_t *ids; /**< task ids, each of an existing task (NULL when n is 0) */
    size_t n;            /**< 0 .. TP_MAX_AFTER; 0: waits for nothing */
} tp_task_after;

/**
 * tp_submit_keyed() with the tasks each task waits for: after[i] for tasks[i] (after
 * NULL: none at all, the same as tp_submit_keyed(); keys may be NULL). A task that
 * waits is answered INVALID when one of its ids names no task (nothing is inserted).
 * A call where no task waits sends the frame tp_submit_keyed() sends; one that does
 * needs a taskpushd of schema version 10 or later (an older one refuses the frame and
 * closes the connection). Since library version 1.4.
 * @return as tp_submit_keyed(); TP_ERANGE also for more than TP_MAX_AFTER ids,
 *         TP_EINVAL for ids NULL with a count or an id 0 (nothing is sent).
 * Thread-safe as tp_submit().
 */
TP_API int tp_submit_after(tp_worker *w, const tp_submit_task *tasks, const tp_group_key *keys,
                           const tp_task_after *after, size_t n, unsigned flags,
                           unsigned timeout_ms, tp_submit_result *results,
                           tp_error *err) TP_WARN_UNUSED;

/**
 * Frees the outputs of results[0..n) filled by tp_submit() and zeroes them.
 * Thread-safe for distinct arrays.
 */
TP_API void tp_submit_results_free(tp_submit_result *results, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TASKPUSH_H */
