/* tls.h: TLS on taskpushd's two ports (and for taskpushctl), with OpenSSL and
 * libevent's OpenSSL bufferevents.
 *
 * taskpushd makes one dsp_tls when --tls-cert is given (dsp_server_init) and
 * every accepted connection borrows it. The worker port and the admin port get
 * contexts of their own, so that a client certificate is asked on the worker
 * port only (with --tls-ca) and no TLS session made on one port can be resumed
 * on the other (resumption is off altogether: connections are long-lived). */
#ifndef TASKPUSH_DSP_TLS_H
#define TASKPUSH_DSP_TLS_H

#include <stddef.h>

struct bufferevent;
struct event_base;
struct ssl_ctx_st;

typedef struct dsp_tls {
    struct ssl_ctx_st *worker; /* verifies client certificates when a CA was given */
    struct ssl_ctx_st *admin;  /* asks no client certificate */
} dsp_tls;

/* Loads the certificate chain cert and its private key key (PEM files) and,
 * when ca is not NULL, the CA file that workers' certificates must chain to.
 * Returns a new dsp_tls (free with dsp_tls_free), or NULL with a one-line
 * reason naming the flag and the file in err. */
dsp_tls *dsp_tls_new(const char *cert, const char *key, const char *ca, char *err, size_t errlen)
    __attribute__((warn_unused_result));
void dsp_tls_free(dsp_tls *tls);

/* A bufferevent that runs the server side of a TLS handshake on fd with ctx
 * (fd -1: evhttp sets it later). A peer's close without close_notify counts as
 * an ordinary EOF, not an error. Returns NULL on failure, and fd then still
 * belongs to the caller. Closes fd when freed. */
struct bufferevent *dsp_tls_accept_bev_new(struct event_base *base, struct ssl_ctx_st *ctx, int fd);

/* The same for evhttp_set_bevcb (the fd comes later). Never NULL while
 * memory lasts: evhttp would serve a NULL's connection in plaintext. */
struct bufferevent *dsp_tls_http_bev_new(struct event_base *base, struct ssl_ctx_st *ctx);

/* Client side, for taskpushctl: a context that verifies the server against
 * the CAs of ca_file (NULL: the system's default paths). NULL with a reason. */
struct ssl_ctx_st *dsp_tls_client_ctx_new(const char *ca_file, char *err, size_t errlen);

/* A bufferevent, not yet connected, that runs the client side of a handshake
 * and checks that the server's certificate names host (an IP address or a DNS
 * name). NULL on failure. */
struct bufferevent *dsp_tls_connect_bev_new(struct event_base *base, struct ssl_ctx_st *ctx,
                                            const char *host);

void dsp_tls_ctx_free(struct ssl_ctx_st *ctx);

/* Why a bufferevent's event ended its connection, for the log: "disconnected"
 * for an EOF, the TLS failure when OpenSSL reported one (with the reason a
 * certificate was refused), else the socket error. Works on plain
 * bufferevents too. */
void dsp_tls_event_text(struct bufferevent *bev, short what, char *buf, size_t len);

/* The TLS failure alone: writes "TLS: reason" and returns 1 when OpenSSL
 * reported one on bev, else returns 0. Takes the errors off bev. */
int dsp_tls_error_text(struct bufferevent *bev, char *buf, size_t len);

#endif
