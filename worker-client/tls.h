/* tls.h: the worker's side of TLS (tls.c), for client.c. */
#ifndef TASKPUSH_WC_TLS_H
#define TASKPUSH_WC_TLS_H

#include "taskpush.h"

#include <stddef.h>

struct bufferevent;
struct event_base;
struct ssl_ctx_st;

/* Makes the TLS context of opts (opts->tls set): the CAs to trust, and the
 * certificate to present. Returns 0 and *out (free with tpi_tls_ctx_free), or
 * TP_EINVAL / TP_ENOMEM with the reason (naming the field and file) in *err. */
int tpi_tls_ctx_new(const tp_worker_options *opts, struct ssl_ctx_st **out, tp_error *err);
void tpi_tls_ctx_free(struct ssl_ctx_st *ctx);

/* A bufferevent, not yet connected (bufferevent_socket_connect does that),
 * that runs the client side of a handshake and refuses a certificate that
 * does not name host (a DNS name or an IP address). A close without
 * close_notify reads as EOF. NULL on failure. [io] */
struct bufferevent *tpi_tls_bev_new(struct event_base *base, struct ssl_ctx_st *ctx,
                                    const char *host);

/* When bev failed in TLS, writes "TLS: reason" (with why a certificate was
 * refused) into buf and returns 1; else returns 0. [io] */
int tpi_tls_error_text(struct bufferevent *bev, char *buf, size_t len);

#endif
