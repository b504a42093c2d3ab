/* output.h: what the I/O thread writes (output.c): frames for the dispatcher and
 * lines for the log callback. Every file of libtaskpush that writes includes it;
 * output.c itself calls none of them. */
#ifndef TASKPUSH_WC_OUTPUT_H
#define TASKPUSH_WC_OUTPUT_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

#include <event2/util.h>

struct bufferevent;

/* Formats a line and passes it to the log callback. [io] Use tpi_log(), which
 * checks the level before anything is formatted. */
void tpi_log_write(tp_worker *w, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define tpi_log(w, lvl, ...)                                                                       \
    do {                                                                                           \
        if ((w)->opts.log != NULL && (lvl) <= (w)->opts.log_level)                                 \
            tpi_log_write((w), (lvl), __VA_ARGS__);                                                \
    } while (0)

/* Queues len bytes for the dispatcher, in the stage or the bufferevent's output (TLS, not
 * yet connected, a large frame, no memory). Returns 0 or -1. [io] */
int tpi_write(tp_worker *w, const void *data, size_t len);

/* The stage, for a frame encoded in place (client.c's DONE): room for n bytes at its
 * end, or NULL when the frame must go to the bufferevent's output instead; then commit
 * what was written. Spill moves the staged frames to the output, before a frame that
 * does not go through the stage and before a close. [io] */
uint8_t *tpi_stage_reserve(tp_worker *w, size_t n);
void tpi_stage_commit(tp_worker *w, size_t n);
int tpi_stage_spill(tp_worker *w);

/* A plaintext connection is connected: from now on its output is written by
 * tpi_output_on_flush, once per loop pass. [io] */
void tpi_output_start_direct(tp_worker *w);

/* The callbacks of w->flush_ev and of the bufferevent's write event. [io] */
void tpi_output_on_flush(evutil_socket_t fd, short what, void *arg);
void tpi_output_on_drained(struct bufferevent *bev, void *arg);

#endif
