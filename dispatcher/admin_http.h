/* admin_http.h: the admin port (admin_http.c): every request of docs/admin.md on
 * evhttp, on the dispatcher's own loop. */
#ifndef TASKPUSH_DSP_ADMIN_HTTP_H
#define TASKPUSH_DSP_ADMIN_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

struct dsp_server;
struct dsp_taskop;
struct evhttp_request;
struct sockaddr_storage;

/* Binds the admin port; writes "HOST:PORT" as bound into bound. */
int dsp_admin_init(struct dsp_server *srv, char *bound, size_t boundlen) __attribute__((warn_unused_result));
/* Creates srv->admin.http with every handler, bound to nothing (dsp_admin_init binds it). */
int dsp_admin_http_new(struct dsp_server *srv) __attribute__((warn_unused_result));
/* Frees srv->admin.http and what admin_http.c keeps of its connections. */
void dsp_admin_http_free(struct dsp_server *srv);
/* True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104 (a socket bound beyond loopback is false). */
bool dsp_addr_is_loopback(const struct sockaddr_storage *ss);

/* What GET /stats, /workers and /history answer now, as {"stats", "workers", "history"},
 * and "listen", the worker port as bound: the dashboard page carries it, so that it
 * shows figures as soon as it has loaded (and a worker command with the real port). */
json_t *dsp_admin_first_json(struct dsp_server *srv);

/* For admin_tasks.c: the answers and checks of admin_http.c. */
bool dsp_admin_only_get(struct evhttp_request *req);
/* The protections of a POST (docs/admin.md); false after answering the refusal. */
bool dsp_admin_post_allowed(struct evhttp_request *req, struct dsp_server *srv);
void dsp_admin_send_error(struct evhttp_request *req, int code, const char *text);
void dsp_admin_send_json(struct evhttp_request *req, int code, json_t *body); /* takes body */

/* admin_tasks.c: GET /task, GET /failed, POST /retry, POST /retry-failed, POST /cancel. */
void dsp_admin_task_cb(struct evhttp_request *req, void *srv);
void dsp_admin_failed_cb(struct evhttp_request *req, void *srv);
void dsp_admin_retry_cb(struct evhttp_request *req, void *srv);
void dsp_admin_retry_failed_cb(struct evhttp_request *req, void *srv);
void dsp_admin_cancel_cb(struct evhttp_request *req, void *srv);
/* The database side's answer to one of them (dsp_db_callbacks.on_taskop). */
void dsp_admin_taskop_answer(void *srv, struct dsp_taskop *op);
/* Whether POST /pause or /resume may name type without force: the dispatcher holds it
 * (workers, buffered tasks, a pause), a worker registered it since the start, or the
 * table figures have NEW, PROCESSING or FAILED rows of it. */
bool dsp_admin_type_known(struct dsp_server *srv, const char *type);
/* The progress its worker reported last for t's current delivery, as {"permille",
 * "message", "at_ms"}, or JSON null (none, buffered, or an earlier attempt's). */
struct dsp_task;
json_t *dsp_admin_progress_json(const struct dsp_task *t);

/* admin_keys.c: GET /keys (the busiest group keys of each type) and GET /progress (the
 * running deliveries with progress, the latest report first). */
void dsp_admin_keys_cb(struct evhttp_request *req, void *srv);
void dsp_admin_progress_cb(struct evhttp_request *req, void *srv);
/* What GET /keys?top=N answers. */
json_t *dsp_admin_keys_json(struct dsp_server *srv, unsigned top);

#endif
