/* task.c: what a handler may ask of and tell about its delivery. */
#include "internal.h"
#include "client.h"
#include "options.h"
#include "pool.h"

#include <stdlib.h>
#include <string.h>

uint64_t tp_task_id(const tp_task *task)
{
    return task->id;
}

const char *tp_task_type(const tp_task *task)
{
    return task->type;
}

const void *tp_task_payload(const tp_task *task, size_t *len)
{
    if (len != NULL)
        *len = task->payload_len;
    return task->payload;
}

uint32_t tp_task_attempt(const tp_task *task)
{
    return task->attempt;
}

uint32_t tp_task_epoch(const tp_task *task)
{
    return task->epoch;
}

uint32_t tp_task_timeout_ms(const tp_task *task)
{
    return task->timeout_ms;
}

int tp_task_priority(const tp_task *task)
{
    return task->priority;
}

int64_t tp_task_remaining_ms(const tp_task *task)
{
    int64_t deadline = atomic_load(&task->deadline_ns);
    int64_t left;

    if (deadline == INT64_MAX)
        return INT64_MAX;
    left = deadline - tpi_now_ns();
    /* Round towards the end of the lease, so that 0 means "over". */
    return left > 0 ? (left + 999999) / 1000000 : left / 1000000;
}

int tp_task_set_result(tp_task *task, const void *data, size_t len)
{
    int rc = TP_EINVAL;
    uint8_t *copy = NULL;

    if (task == NULL || (data == NULL && len > 0))
        goto done;
    if (len > task->max_data) {
        task->result_refused = len;
        rc = TP_ETOOBIG;
        goto done;
    }
    if (len > 0) {
        copy = malloc(len);
        if (copy == NULL) {
            rc = TP_ENOMEM;
            goto done;
        }
        memcpy(copy, data, len);
    }
    free(task->result);
    task->result = copy;
    task->result_len = len;
    task->result_refused = 0;
    copy = NULL;
    rc = TP_OK;
done:
    free(copy);
    return rc;
}

/* utf8_cut returns the largest n' <= n that does not split a UTF-8 sequence of s. */
static size_t utf8_cut(const char *s, size_t len, size_t n)
{
    if (n >= len)
        return len;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--;
    return n;
}

int tp_task_set_error(tp_task *task, const char *msg)
{
    int rc = TP_EINVAL;
    size_t len;
    size_t limit;
    char *copy = NULL;

    if (task == NULL || msg == NULL)
        goto done;
    len = strlen(msg);
    limit = task->max_data < TP_MAX_ERROR_LEN ? task->max_data : TP_MAX_ERROR_LEN;
    len = utf8_cut(msg, len, limit);
    copy = malloc(len + 1);
    if (copy == NULL) {
        rc = TP_ENOMEM;
        goto done;
    }
    memcpy(copy, msg, len);
    copy[len] = '\0';
    free(task->error);
    task->error = copy;
    task->error_len = len;
    copy = NULL;
    rc = TP_OK;
done:
    free(copy);
    return rc;
}

void tp_task_set_retry_after(tp_task *task, uint32_t ms)
{
    task->retry_after_ms = ms;
}

int tp_task_extend(tp_task *task, uint32_t ms)
{
    int rc = TP_EINVAL;
    tp_worker *w;

    if (task == NULL || ms == 0)
        goto done;
    if (atomic_load(&task->cancelled)) {
        rc = TP_EGONE;
        goto done;
    }
    w = task->w;
    atomic_store(&task->deadline_ns, tpi_now_ns() + (int64_t)ms * 1000000);
    if (pthread_equal(pthread_self(), w->io_thread))
        tpi_conn_send_extend(w, task, ms); /* an inline handler: no queue needed */
    else
        tpi_extend_push(w, task, ms);
    rc = TP_OK;
done:
    return rc;
}

_Static_assert(TP_MAX_PROGRESS_MSG_LEN == PROTO_MAX_PROGRESS_MSG && TP_PROGRESS_MAX == PROTO_PROGRESS_MAX,
               "taskpush.h states the protocol's bounds");

int tp_task_progress(tp_task *task, unsigned permille, const char *msg)
{
    size_t len = msg ? strnlen(msg, TP_MAX_PROGRESS_MSG_LEN + 1) : 0;
    tp_worker *w;

    if (task == NULL)
        return TP_EINVAL;
    if (permille > TP_PROGRESS_MAX || len > TP_MAX_PROGRESS_MSG_LEN)
        return TP_ERANGE;
    if (!proto_utf8_valid((proto_bytes){(const uint8_t *)msg, len}))
        return TP_EINVAL;
    if (task->version < 4)
        return TP_ENOTSUP; /* the dispatcher would close the connection for the frame */
    if (atomic_load(&task->cancelled))
        return TP_EGONE;
    w = task->w;
    if (pthread_equal(pthread_self(), w->io_thread))
        tpi_conn_send_progress(w, task, (uint16_t)permille, msg, len); /* an inline handler */
    else
        tpi_progress_push(w, task, (uint16_t)permille, msg, len);
    return TP_OK;
}

int tp_task_cancelled(const tp_task *task)
{
    return atomic_load(&task->cancelled) != 0;
}
