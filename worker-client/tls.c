/* tls.c: the worker's side of TLS (tp_worker_options.tls), on OpenSSL and
 * libevent's OpenSSL bufferevents. One SSL_CTX per worker, made by
 * tp_worker_new() (so that a bad file is an error there, not a retry loop),
 * and one SSL per connection. */
#include "tls.h"
#include "options.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

/* The root error of OpenSSL's queue as text; clears the queue. */
static const char *ssl_error_text(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();

    if (e == 0)
        snprintf(buf, len, "unknown OpenSSL error");
    else
        ERR_error_string_n(e, buf, len);
    ERR_clear_error();
    return buf;
}

/* OpenSSL's default asks for a key's passphrase on the terminal: a library
 * must not, so an encrypted key simply fails to load. */
static int no_passphrase(char *buf, int size, int rwflag, void *arg)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)arg;
    return 0;
}

static int check_readable(const char *field, const char *path, tp_error *err)
{
    FILE *f = fopen(path, "r");

    if (f == NULL)
        return tpi_error_set(err, TP_EINVAL, "%s %s: %s", field, path, strerror(errno));
    fclose(f);
    return TP_OK;
}

int tpi_tls_ctx_new(const tp_worker_options *o, struct ssl_ctx_st **out, tp_error *err)
{
    int rc = TP_EINVAL;
    char why[256];
    SSL_CTX *ctx = NULL;

    *out = NULL;
    if ((o->tls_ca_file != NULL && check_readable("tls_ca_file", o->tls_ca_file, err) < 0) ||
        (o->tls_cert_file != NULL && check_readable("tls_cert_file", o->tls_cert_file, err) < 0) ||
        (o->tls_key_file != NULL && check_readable("tls_key_file", o->tls_key_file, err) < 0))
        goto done;
    ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        rc = tpi_error_set(err, TP_ENOMEM, "cannot create a TLS context: %s",
                           ssl_error_text(why, sizeof(why)));
        goto done;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* OpenSSL 3 reports a close without close_notify as a protocol error, and
     * libevent 2.1 as BEV_EVENT_ERROR; this makes it an EOF. Frames carry
     * their length, so a truncation cannot pass for a whole frame. */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if ((o->tls_ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, o->tls_ca_file, NULL)
                                : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
        tpi_error_set(err, rc, "tls_ca_file %s: no usable PEM CA certificate (%s)",
                      o->tls_ca_file != NULL ? o->tls_ca_file : "(system default)",
                      ssl_error_text(why, sizeof(why)));
        goto done;
    }
    if (o->tls_cert_file != NULL) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert_file) != 1) {
            tpi_error_set(err, rc, "tls_cert_file %s: not a usable PEM certificate (%s)",
                          o->tls_cert_file, ssl_error_text(why, sizeof(why)));
            goto done;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, o->tls_key_file, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            tpi_error_set(err, rc, "tls_key_file %s: not the private key of %s, or not usable (%s)",
                          o->tls_key_file, o->tls_cert_file, ssl_error_text(why, sizeof(why)));
            goto done;
        }
    }
    *out = ctx;
    ctx = NULL;
    rc = TP_OK;
done:
    SSL_CTX_free(ctx);
    return rc;
}

void tpi_tls_ctx_free(struct ssl_ctx_st *ctx)
{
    SSL_CTX_free(ctx);
}

struct bufferevent *tpi_tls_bev_new(struct event_base *base, struct ssl_ctx_st *ctx, const char *host)
{
    unsigned char addr[sizeof(struct in6_addr)];
    struct bufferevent *bev;
    SSL *ssl = SSL_new(ctx);
    int ok;

    if (ssl == NULL)
        return NULL;
    if (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1) {
        /* An address must be an IP entry of the certificate; SNI carries DNS names only. */
        ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1;
    } else {
        ok = SSL_set1_host(ssl, host) == 1 && SSL_set_tlsext_host_name(ssl, host) == 1;
    }
    if (!ok) {
        SSL_free(ssl);
        ERR_clear_error();
        return NULL;
    }
    /* On failure libevent frees ssl itself (BEV_OPT_CLOSE_ON_FREE). */
    bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                         BEV_OPT_CLOSE_ON_FREE);
    if (bev != NULL)
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

int tpi_tls_error_text(struct bufferevent *bev, char *buf, size_t len)
{
    unsigned long e;
    unsigned long root = 0;
    char text[256];
    SSL *ssl;
    long v;

    /* libevent keeps the failure's errors with the bufferevent, newest first,
     * after SSL_get_error's code (a small number of no library); the oldest
     * says most. */
    while ((e = bufferevent_get_openssl_error(bev)) != 0)
        if (ERR_GET_LIB(e) != 0)
            root = e;
    if (root == 0)
        return 0;
    ERR_error_string_n(root, text, sizeof(text));
    ssl = bufferevent_openssl_get_ssl(bev);
    v = ssl != NULL ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (v != X509_V_OK)
        snprintf(buf, len, "TLS: %s (%s)", text, X509_verify_cert_error_string(v));
    else
        snprintf(buf, len, "TLS: %s", text);
    return 1;
}
