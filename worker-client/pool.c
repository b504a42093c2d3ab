/* pool.c: the handler threads, and the two queues between them and the I/O
 * thread.
 *
 * Tasks go to the threads through the job queue (a FIFO under job_mu with a
 * condition variable). Its length is bounded by the protocol: the dispatcher
 * never has more than `capacity` deliveries outstanding on a connection, and
 * the I/O thread closes a connection that sends more; deliveries of a lost
 * connection only linger until their (cancelled) handlers return.
 *
 * Outcomes come back through the done queue under done_mu. Only the push that
 * finds the queue idle writes to the eventfd, so a burst of outcomes costs one
 * wake-up, and the I/O thread turns all of them into DONE frames in one
 * callback: they leave in one write. EXTEND requests ride the same lock and
 * wake-up.
 */
#include "pool.h"
#include "output.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void tpi_task_free(tp_task *t)
{
    if (t == NULL)
        return;
    free(t->result);
    free(t->error);
    free(t);
}

/* set_error_text stores a library-made error text unless the handler set one. */
static void set_error_text(tp_task *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_error_text(tp_task *t, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    int n;

    if (t->error != NULL)
        return;
    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    if ((size_t)n > t->max_data)
        n = (int)t->max_data;
    t->error = malloc((size_t)n + 1);
    if (t->error == NULL)
        return;
    memcpy(t->error, buf, (size_t)n);
    t->error[n] = '\0';
    t->error_len = (size_t)n;
}

void tpi_task_execute(tp_task *t)
{
    int rc;

    if (atomic_load(&t->cancelled)) {
        t->outcome = TP_FAIL;
        set_error_text(t, "cancelled before its handler started");
        return;
    }
    if (t->type_reg == NULL) {
        t->outcome = TP_FAIL;
        set_error_text(t, "worker has no handler for type '%s'", t->type);
        return;
    }
    rc = t->type_reg->fn(t, t->type_reg->arg);
    switch (rc) {
    case TP_SUCCESS:
    case TP_FAIL:
    case TP_FAIL_PERMANENT:
    case TP_RETRY_AFTER:
        t->outcome = rc;
        break;
    default:
        t->outcome = TP_FAIL;
        set_error_text(t, "handler returned %d, not a tp_outcome", rc);
        break;
    }
}

static void *pool_main(void *arg)
{
    tp_worker *w = arg;
    tp_task *t;

    pthread_mutex_lock(&w->job_mu);
    for (;;) {
        while (w->job_head == NULL && !w->job_quit)
            pthread_cond_wait(&w->job_cv, &w->job_mu);
        t = w->job_head;
        if (t == NULL)
            break; /* quitting and nothing left */
        w->job_head = t->next;
        if (w->job_head == NULL)
            w->job_tail = NULL;
        t->next = NULL;
        pthread_mutex_unlock(&w->job_mu);

        tpi_task_execute(t);
        tpi_done_push(w, t);

        pthread_mutex_lock(&w->job_mu);
    }
    pthread_mutex_unlock(&w->job_mu);
    return NULL;
}

int tpi_pool_start(tp_worker *w)
{
    int rc = TP_OK;
    unsigned n = w->opts.threads;

    w->nthreads = 0;
    if (n == 0)
        goto done;
    w->threads = calloc(n, sizeof(*w->threads));
    if (w->threads == NULL) {
        rc = TP_ENOMEM;
        goto done;
    }
    w->job_quit = 0;
    for (unsigned i = 0; i < n; i++) {
        int e = pthread_create(&w->threads[i], NULL, pool_main, w);

        if (e != 0) {
            tpi_log(w, TP_LOG_ERROR, "cannot start handler thread %u of %u: %s", i + 1, n,
                    strerror(e));
            rc = TP_ESYS;
            goto done;
        }
        w->nthreads++;
    }
done:
    if (rc < 0)
        tpi_pool_join(w);
    return rc;
}

void tpi_pool_join(tp_worker *w)
{
    pthread_mutex_lock(&w->job_mu);
    w->job_quit = 1;
    pthread_cond_broadcast(&w->job_cv);
    pthread_mutex_unlock(&w->job_mu);
    for (unsigned i = 0; i < w->nthreads; i++)
        pthread_join(w->threads[i], NULL);
    w->nthreads = 0;
    free(w->threads);
    w->threads = NULL;
    w->job_quit = 0;
}

void tpi_pool_submit(tp_worker *w, tp_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&w->job_mu);
    if (w->job_tail != NULL)
        w->job_tail->next = t;
    else
        w->job_head = t;
    w->job_tail = t;
    pthread_cond_signal(&w->job_cv);
    pthread_mutex_unlock(&w->job_mu);
}

/* wake writes to the eventfd; a full counter (EAGAIN) already means "wake up". */
static void wake(tp_worker *w)
{
    uint64_t one = 1;
    ssize_t n;

    do
        n = write(w->wake_fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
}

void tpi_done_push(tp_worker *w, tp_task *t)
{
    int need_wake;

    t->next = NULL;
    pthread_mutex_lock(&w->done_mu);
    if (w->done_tail != NULL)
        w->done_tail->next = t;
    else
        w->done_head = t;
    w->done_tail = t;
    need_wake = !w->wake_pending;
    w->wake_pending = 1;
    pthread_mutex_unlock(&w->done_mu);
    if (need_wake)
        wake(w);
}

void tpi_extend_push(tp_worker *w, tp_task *t, uint32_t ms)
{
    int need_wake;

    pthread_mutex_lock(&w->done_mu);
    if (!t->ext_pending) {
        t->ext_pending = 1;
        t->ext_next = w->ext_head;
        w->ext_head = t;
    }
    t->ext_ms = ms; /* a newer request replaces one not yet sent */
    need_wake = !w->wake_pending;
    w->wake_pending = 1;
    pthread_mutex_unlock(&w->done_mu);
    if (need_wake)
        wake(w);
}

void tpi_progress_push(tp_worker *w, tp_task *t, uint16_t permille, const char *msg, size_t len)
{
    int need_wake;

    pthread_mutex_lock(&w->done_mu);
    if (!t->ext_pending) {
        t->ext_pending = 1;
        t->ext_next = w->ext_head;
        w->ext_head = t;
    }
    t->prog_pending = 1; /* a newer report replaces one not yet sent */
    t->prog_permille = permille;
    t->prog_len = (uint16_t)len;
    if (len > 0)
        memcpy(t->prog_msg, msg, len);
    need_wake = !w->wake_pending;
    w->wake_pending = 1;
    pthread_mutex_unlock(&w->done_mu);
    if (need_wake)
        wake(w);
}

void tpi_done_take(tp_worker *w, tp_task **done, tp_task **ext)
{
    pthread_mutex_lock(&w->done_mu);
    *done = w->done_head;
    *ext = w->ext_head;
    w->done_head = w->done_tail = NULL;
    w->ext_head = NULL;
    for (tp_task *t = *ext; t != NULL; t = t->ext_next) {
        t->ext_pending = 0;
        t->ext_send_ms = t->ext_ms;
        t->ext_ms = 0;
        t->prog_send = t->prog_pending;
        t->prog_pending = 0;
        if (t->prog_send) {
            t->prog_send_permille = t->prog_permille;
            t->prog_send_len = t->prog_len;
            memcpy(t->prog_send_msg, t->prog_msg, t->prog_len);
        }
        t->ext_taken_next = t->ext_next;
    }
    w->wake_pending = 0;
    pthread_mutex_unlock(&w->done_mu);
}
