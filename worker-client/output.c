/* output.c: what the I/O thread writes: frames for the dispatcher (tpi_write and
 * the stage that gathers them) and lines for the log callback (tpi_log_write).
 * client.c, inventory.c, submit.c and pool.c all write, and client.c calls the
 * other three; the writers live here, below all four, so that none of those files
 * has to call back into client.c.
 *
 * A plaintext connection writes its socket itself, once per loop pass, rather than
 * through the bufferevent's write event: that saves two epoll_ctl calls and a loop
 * pass for every batch of DONEs. The pass's frames are gathered in the stage
 * (frame_stage.h) and go out in one send: about 500 instructions a task less at
 * capacity 4. The write event is on only while the socket refuses part of the output.
 * TLS connections keep the bufferevent's own writes. */
#include "output.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

/* ---- log lines ---- */

void tpi_log_write(tp_worker *w, int level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    w->opts.log(w->opts.log_arg, level, line);
}

/* ---- frames ---- */

static void queue_flush(tp_worker *w)
{
    if (!w->flush_queued) {
        w->flush_queued = 1;
        event_active(w->flush_ev, EV_TIMEOUT, 0);
    }
}

static void on_output_added(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    tp_worker *w = arg;

    (void)buf;
    if (info->n_added > 0 && w->direct_write)
        queue_flush(w);
}

/* A plaintext connection, once connected, has its output written by tpi_output_on_flush. */
void tpi_output_start_direct(tp_worker *w)
{
    if (evbuffer_add_cb(bufferevent_get_output(w->bev), on_output_added, w) != NULL) {
        w->direct_write = 1;
        bufferevent_disable(w->bev, EV_WRITE);
    }
}

/* The stage's frames go after what the output already holds. */
int tpi_stage_spill(tp_worker *w)
{
    int rc = 0;

    if (w->stage.len > 0 && w->bev != NULL)
        rc = evbuffer_add(bufferevent_get_output(w->bev), w->stage.buf, w->stage.len);
    w->stage.len = 0;
    return rc;
}

/* Room for n bytes at the end of the stage, or NULL (see tpi_write). */
uint8_t *tpi_stage_reserve(tp_worker *w, size_t n)
{
    uint8_t *p;

    if (!w->direct_write) {
        (void)tpi_stage_spill(w); /* frames staged before a close turned direct writes off */
        return NULL;
    }
    p = proto_frame_stage_reserve(&w->stage, n);
    if (p == NULL && tpi_stage_spill(w) == 0) /* full, too large a frame, or no memory */
        p = proto_frame_stage_reserve(&w->stage, n);
    return p;
}

void tpi_stage_commit(tp_worker *w, size_t n)
{
    w->stage.len += n;
    queue_flush(w);
}

int tpi_write(tp_worker *w, const void *data, size_t len)
{
    uint8_t *p;

    if (w->bev == NULL)
        return -1;
    p = tpi_stage_reserve(w, len);
    if (p == NULL)
        return bufferevent_write(w->bev, data, len);
    memcpy(p, data, len);
    tpi_stage_commit(w, len);
    return 0;
}

/* Sends the stage when the output is empty; what the socket does not take now, and the
 * whole stage otherwise, joins the output. */
static void stage_send(tp_worker *w)
{
    if (w->stage.len == 0)
        return;
    if (evbuffer_get_length(bufferevent_get_output(w->bev)) == 0)
        (void)proto_frame_stage_send(&w->stage, bufferevent_getfd(w->bev));
    (void)tpi_stage_spill(w); /* out of memory: those frames are lost with the connection */
    proto_frame_stage_shrink(&w->stage, 1); /* a worker has one connection: keep up to 4 KiB */
}

void tpi_output_on_flush(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;
    struct evbuffer *out;

    (void)fd;
    (void)what;
    if (w->bev == NULL || !w->direct_write) {
        w->flush_queued = 0;
        return;
    }
    stage_send(w); /* flush_queued still set: what it spills queues no second pass */
    w->flush_queued = 0;
    out = bufferevent_get_output(w->bev);
    if (evbuffer_get_length(out) == 0)
        return;
    /* The bufferevent keeps the start of its output frozen except inside its own
     * write callback; do as it does. An error leaves the output for the write event,
     * which reports it through on_event. */
    evbuffer_unfreeze(out, 1);
    (void)evbuffer_write(out, bufferevent_getfd(w->bev));
    evbuffer_freeze(out, 1);
    if (evbuffer_get_length(out) > 0)
        bufferevent_enable(w->bev, EV_WRITE);
}

/* The write event took the rest of the output: off again until the socket refuses some. */
void tpi_output_on_drained(struct bufferevent *bev, void *arg)
{
    tp_worker *w = arg;

    if (w->direct_write && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        bufferevent_disable(bev, EV_WRITE);
}