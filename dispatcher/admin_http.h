/* admin_http.h: the admin port (admin_http.c): every request of docs/admin.md on
 * evhttp, on the dispatcher's own loop. */
#ifndef TASKPUSH_DSP_ADMIN_HTTP_H
#define TASKPUSH_DSP_ADMIN_HTTP_H

#include <stdbool.h>
#include <stddef.h>

struct dsp_server;
struct sockaddr_storage;

/* Binds the admin port; writes "HOST:PORT" as bound into bound. */
int dsp_admin_init(struct dsp_server *srv, char *bound, size_t boundlen) __attribute__((warn_unused_result));
/* Creates srv->http with every handler, bound to nothing (dsp_admin_init binds it). */
int dsp_admin_http_new(struct dsp_server *srv) __attribute__((warn_unused_result));
/* True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104 (a socket bound beyond loopback is false). */
bool dsp_addr_is_loopback(const struct sockaddr_storage *ss);

#endif
