/* inproc_worker: in-process workers and gates (see inproc_worker.h). */
#include "inproc_worker.h"

#include <stdio.h>
#include <time.h>

static void *inproc_main(void *arg)
{
    tp_inproc *p = arg;
    p->rc = tp_worker_run(p->w);
    return NULL;
}

int tp_inproc_start(tp_inproc *p, tp_worker *w)
{
    p->w = w;
    p->rc = 0;
    if (pthread_create(&p->thr, NULL, inproc_main, p) != 0)
        return -1;
    p->running = true;
    return 0;
}

int tp_inproc_join(tp_inproc *p)
{
    if (!p->running)
        return 0;
    pthread_join(p->thr, NULL);
    p->running = false;
    return p->rc;
}

bool tp_inproc_join_within(tp_inproc *p, int timeout_ms)
{
    if (!p->running)
        return true;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (pthread_timedjoin_np(p->thr, NULL, &ts) != 0)
        return false;
    p->running = false;
    return true;
}

int tp_inproc_halt(tp_inproc *p)
{
    if (!p->running)
        return 0;
    tp_worker_stop(p->w);
    tp_worker_stop(p->w);
    return tp_inproc_join(p);
}

void tp_gate_init(tp_gate *g, bool open)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = open;
    g->waiting = 0;
}

void tp_gate_destroy(tp_gate *g)
{
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

void tp_gate_pass(tp_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->waiting++;
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    g->waiting--;
    pthread_mutex_unlock(&g->mu);
}

void tp_gate_set(tp_gate *g, bool open)
{
    pthread_mutex_lock(&g->mu);
    g->open = open;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

int tp_gate_waiting(tp_gate *g)
{
    pthread_mutex_lock(&g->mu);
    int n = g->waiting;
    pthread_mutex_unlock(&g->mu);
    return n;
}

tp_worker *tp_inproc_start_one(tp_inproc *p, const char *addresses, const char *name,
                               unsigned capacity, const char *type, tp_handler fn, void *arg)
{
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = addresses;
    o.name = name;
    o.capacity = capacity;
    o.threads = capacity;
    tp_worker *w = tp_worker_new(&o, &err);
    if (!w) {
        fprintf(stderr, "tp_worker_new: %s\n", err.text);
        return NULL;
    }
    if (tp_worker_add_type(w, type, fn, arg) != 0 || tp_inproc_start(p, w) != 0) {
        fprintf(stderr, "%s: cannot add type %s or start its thread\n", name, type);
        tp_worker_free(w);
        return NULL;
    }
    return w;
}
