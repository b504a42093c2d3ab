/* stats.h: the dispatcher's counters, listed once.
 *
 * Each X(name, help) line generates a struct field and its entry in /stats and
 * /metrics, so a counter cannot be added to one and forgotten in the other.
 * Counters only grow; all are touched on the loop thread only. */
#ifndef TASKPUSH_DSP_STATS_H
#define TASKPUSH_DSP_STATS_H

#include <stdint.h>

/* The "tasks" object of /stats (SPEC.md names the first six). */
#define DSP_TASK_COUNTERS(X)                                                                  \
    X(claimed_total, "tasks claimed from the table")                                         \
    X(dispatched_total, "deliveries sent to workers")                                        \
    X(succeeded_total, "tasks that ended SUCCESSFUL")                                        \
    X(failed_total, "tasks that ended FAILED")                                               \
    X(retried_total, "failed attempts sent back to NEW with a backoff")                     \
    X(requeued_total, "deliveries taken back from a lost or timed-out worker")              \
    X(released_total, "claimed tasks put back to NEW undelivered (drain, shutdown)")        \
    X(timed_out_total, "deliveries cancelled because their lease expired")                  \
    X(late_results_total, "results ignored because their delivery was no longer current")   \
    X(extends_total, "lease extensions received")

/* The "connections" object of /stats. */
#define DSP_CONN_COUNTERS(X)                                                                  \
    X(accepted_total, "worker connections accepted")                                         \
    X(rejected_total, "connections refused at HELLO (version, token, bad hello)")           \
    X(bad_frames_total, "connections closed for a malformed or oversized frame")            \
    X(lost_total, "workers lost: disconnected or silent for 3 heartbeats")                  \
    X(yields_total, "read callbacks that stopped at the frame budget to let others run")    \
    X(frames_in_total, "frames received")                                                    \
    X(frames_out_total, "frames sent")

#define DSP_STATS_FIELD(name, help) uint64_t name;

typedef struct dsp_task_stats {
    DSP_TASK_COUNTERS(DSP_STATS_FIELD)
} dsp_task_stats;

typedef struct dsp_conn_stats {
    DSP_CONN_COUNTERS(DSP_STATS_FIELD)
} dsp_conn_stats;

#endif
