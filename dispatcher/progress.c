/* progress.c: see progress.h. Runs on the loop thread; the statements run on the stats
 * thread (dsp_db_progress_save), so a slow database never holds up the loop, and a
 * task reporting a hundred times a second costs one row write a second. */
#include "progress.h"

#include "conn.h"

#include <stdlib.h>
#include <string.h>

/* Ended tasks whose rows wait for their deletion, at most: beyond (the database away
 * for long), a row is left behind, shown by nobody (GET /task shows a stored report only
 * of a PROCESSING row) and replaced by the task's next report. */
#define GONE_MAX 100000

#define FLUSH_EVERY_MS 1000

static bool push_id(uint64_t **v, size_t *n, size_t *cap, uint64_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        uint64_t *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return false;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = id;
    return true;
}

void dsp_progress_note(dsp_server *srv, dsp_task *t)
{
    /* Each task is on the list once, whatever it reports meanwhile: the list is at most
     * the deliveries in flight. */
    if (t->progress->dirty)
        return;
    if (push_id(&srv->progress.dirty, &srv->progress.ndirty, &srv->progress.dirty_cap, t->id))
        t->progress->dirty = true;
}

void dsp_progress_task_gone(dsp_server *srv, const dsp_task *t)
{
    if (t->progress->stored && srv->progress.ngone < GONE_MAX)
        push_id(&srv->progress.gone, &srv->progress.ngone, &srv->progress.gone_cap, t->id);
}

/* Removes the first n ids of a list (an empty list may have no array: no memmove). */
static void drop_front(uint64_t *v, size_t *len, size_t n)
{
    if (n == 0)
        return;
    memmove(v, v + n, (*len - n) * sizeof *v);
    *len -= n;
}

void dsp_progress_flush(dsp_server *srv, int64_t now_ms)
{
    if (now_ms < srv->progress.next_flush_ms || (srv->progress.ndirty == 0 && srv->progress.ngone == 0))
        return;
    srv->progress.next_flush_ms = now_ms + FLUSH_EVERY_MS;
    if (!srv->lead.leading) {
        /* A standby holds no task; a deposed leader's reports are the next leader's to write. */
        for (size_t i = 0; i < srv->progress.ndirty; i++) {
            dsp_task *t = dsp_taskmap_get(&srv->tasks.map, srv->progress.dirty[i]);
            if (t && t->progress)
                t->progress->dirty = false;
        }
        srv->progress.ndirty = srv->progress.ngone = 0;
        return;
    }
    size_t take = srv->progress.ndirty < DSP_DB_PROGRESS_BATCH ? srv->progress.ndirty : DSP_DB_PROGRESS_BATCH;
    size_t ngone = srv->progress.ngone < DSP_DB_PROGRESS_BATCH ? srv->progress.ngone : DSP_DB_PROGRESS_BATCH;
    dsp_progress_row *rows = take ? malloc(take * sizeof *rows) : NULL;
    uint64_t *gone = ngone ? malloc(ngone * sizeof *gone) : NULL;
    if ((take && !rows) || (ngone && !gone)) {
        free(rows);
        free(gone);
        return; /* out of memory: the next tick tries again */
    }
    size_t n = 0;
    for (size_t i = 0; i < take; i++) {
        dsp_task *t = dsp_taskmap_get(&srv->tasks.map, srv->progress.dirty[i]);
        dsp_progress *p = t ? t->progress : NULL;
        if (!p || !p->dirty)
            continue; /* ended, or its record reused by another task */
        p->dirty = false;
        if (!t->holder || p->attempt != t->attempts)
            continue; /* taken back meanwhile: the report is of an earlier delivery */
        dsp_progress_row *r = &rows[n++];
        r->task_id = t->id;
        r->epoch = t->dlv_epoch;
        r->attempt = p->attempt;
        r->permille = p->permille;
        r->msg_len = p->msg_len;
        memcpy(r->msg, p->msg, p->msg_len);
        r->reported_ms = p->at_ms;
        p->stored = true;
    }
    if (gone)
        memcpy(gone, srv->progress.gone, ngone * sizeof *gone);
    drop_front(srv->progress.dirty, &srv->progress.ndirty, take);
    drop_front(srv->progress.gone, &srv->progress.ngone, ngone);
    if (n == 0 && ngone == 0) {
        free(rows);
        free(gone);
        return;
    }
    dsp_db_progress_save(srv->db, rows, n, gone, ngone); /* takes both, in every case */
}

void dsp_progress_free(dsp_server *srv)
{
    free(srv->progress.dirty);
    free(srv->progress.gone);
    memset(&srv->progress, 0, sizeof srv->progress);
}
