/* inproc_worker: libtaskpush workers on threads of the test process, and the gate their
 * handlers can be held at.
 *
 * The test builds and configures its tp_worker itself (options and types differ from
 * test to test); tp_inproc only runs it on a thread and joins it. A tp_gate holds
 * handlers until the test opens it, so that a test sees tasks in flight. */
#ifndef TASKPUSH_TESTS_INPROC_WORKER_H
#define TASKPUSH_TESTS_INPROC_WORKER_H

#include <pthread.h>
#include <stdbool.h>

#include "taskpush.h"

typedef struct tp_inproc {
    tp_worker *w;
    pthread_t thr;
    int rc;       /* what tp_worker_run returned, once joined */
    bool running; /* the thread was started and not yet joined */
} tp_inproc;

/* Runs w (types already added) with tp_worker_run on a new thread. Returns 0, or -1
 * when the thread could not be made. */
int tp_inproc_start(tp_inproc *p, tp_worker *w);

/* The common case in one call: a worker named name on addresses, capacity slots each run
 * on a thread of its own, serving one type with fn(arg), started on p. Returns the
 * worker (the test frees it), or NULL after a message on stderr. */
tp_worker *tp_inproc_start_one(tp_inproc *p, const char *addresses, const char *name,
                               unsigned capacity, const char *type, tp_handler fn, void *arg);

/* Waits for the thread (after a tp_worker_stop) and returns tp_worker_run's result;
 * 0 when it was not running. Does not free the worker. */
int tp_inproc_join(tp_inproc *p);

/* tp_inproc_join, waiting at most timeout_ms: true when the thread ended (p->rc is
 * then tp_worker_run's result, or it was not running), false when it still runs. */
bool tp_inproc_join_within(tp_inproc *p, int timeout_ms);

/* A teardown's stop: tp_worker_stop twice (the second does not wait for handlers, see
 * taskpush.h), then tp_inproc_join. 0 when it was not running. */
int tp_inproc_halt(tp_inproc *p);

typedef struct tp_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
    int waiting; /* handlers held now */
} tp_gate;

void tp_gate_init(tp_gate *g, bool open);
void tp_gate_destroy(tp_gate *g);
/* Returns at once when open, else waits until it opens. */
void tp_gate_pass(tp_gate *g);
void tp_gate_set(tp_gate *g, bool open);
/* How many handlers wait at the gate now. */
int tp_gate_waiting(tp_gate *g);

#endif
