#include "tls.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/util.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first (root) error on OpenSSL's queue as text, and clears the queue. */
static const char *ssl_error_text(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (!e) {
        snprintf(buf, len, "unknown OpenSSL error");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

/* A readable file, or a reason naming the flag: OpenSSL's own text for a
 * missing file is "system lib". */
static int check_readable(const char *flag, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s %s: %s", flag, path, strerror(errno));
        return -1;
    }
    fclose(f);
    return 0;
}

/* OpenSSL's default asks for a key's passphrase on the terminal; a daemon
 * cannot answer, so an encrypted key simply fails to load. */
static int no_passphrase(char *buf, int size, int rwflag, void *arg)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)arg;
    return 0;
}

/* What both sides share: TLS 1.2 at least, and no session resumption. */
static SSL_CTX *ctx_new(const SSL_METHOD *method)
{
    SSL_CTX *ctx = SSL_CTX_new(method);
    if (!ctx)
        return NULL;
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* OpenSSL 3 reports a peer's close without close_notify as a protocol
     * error, which libevent 2.1 turns into BEV_EVENT_ERROR; with this option it
     * is an EOF that allow_dirty_shutdown reports as such. Truncation cannot go
     * unnoticed: frames carry their length, and so do HTTP bodies. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    return ctx;
}

static SSL_CTX *server_ctx_new(const char *cert, const char *key, const char *ca, char *err,
                               size_t errlen)
{
    char why[256];
    SSL_CTX *ctx = ctx_new(TLS_server_method());
    if (!ctx) {
        snprintf(err, errlen, "cannot create a TLS context: %s", ssl_error_text(why, sizeof why));
        return NULL;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(err, errlen, "--tls-cert %s: not a usable PEM certificate (%s)", cert,
                 ssl_error_text(why, sizeof why));
        goto bad;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(err, errlen, "--tls-key %s: not a usable PEM private key (%s)", key,
                 ssl_error_text(why, sizeof why));
        goto bad;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "--tls-key %s does not match the certificate of --tls-cert %s", key, cert);
        ERR_clear_error();
        goto bad;
    }
    if (ca) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca);
        if (!names || SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
            if (names)
                sk_X509_NAME_pop_free(names, X509_NAME_free);
            snprintf(err, errlen, "--tls-ca %s: no usable PEM CA certificate (%s)", ca,
                     ssl_error_text(why, sizeof why));
            goto bad;
        }
        SSL_CTX_set_client_CA_list(ctx, names); /* takes names */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    return ctx;
bad:
    SSL_CTX_free(ctx);
    return NULL;
}

dsp_tls *dsp_tls_new(const char *cert, const char *key, const char *ca, char *err, size_t errlen)
{
    if (check_readable("--tls-cert", cert, err, errlen) < 0 ||
        check_readable("--tls-key", key, err, errlen) < 0 ||
        (ca && check_readable("--tls-ca", ca, err, errlen) < 0))
        return NULL;
    dsp_tls *tls = calloc(1, sizeof *tls);
    if (!tls) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(tls->worker = server_ctx_new(cert, key, ca, err, errlen)) ||
        !(tls->admin = server_ctx_new(cert, key, NULL, err, errlen))) {
        dsp_tls_free(tls);
        return NULL;
    }
    return tls;
}

void dsp_tls_free(dsp_tls *tls)
{
    if (!tls)
        return;
    SSL_CTX_free(tls->worker);
    SSL_CTX_free(tls->admin);
    free(tls);
}

void dsp_tls_ctx_free(SSL_CTX *ctx)
{
    SSL_CTX_free(ctx);
}

struct bufferevent *dsp_tls_accept_bev_new(struct event_base *base, SSL_CTX *ctx, int fd)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl)
        return NULL;
    /* On failure libevent frees ssl (CLOSE_ON_FREE) but leaves fd open. */
    struct bufferevent *bev =
        bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (bev)
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

struct bufferevent *dsp_tls_http_bev_new(struct event_base *base, SSL_CTX *ctx)
{
    struct bufferevent *bev = dsp_tls_accept_bev_new(base, ctx, -1);
    if (bev)
        return bev;
    /* evhttp reads a NULL from its bevcb as "plaintext, please". Hand it a
     * bufferevent that cannot take a socket (one end of a pair), so that it
     * closes this connection instead. */
    struct bufferevent *pair[2];
    if (bufferevent_pair_new(base, BEV_OPT_CLOSE_ON_FREE, pair) != 0)
        return NULL;
    bufferevent_free(pair[1]);
    return pair[0];
}

SSL_CTX *dsp_tls_client_ctx_new(const char *ca_file, char *err, size_t errlen)
{
    char why[256];
    if (ca_file && check_readable("--tls-ca", ca_file, err, errlen) < 0)
        return NULL;
    SSL_CTX *ctx = ctx_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, errlen, "cannot create a TLS context: %s", ssl_error_text(why, sizeof why));
        return NULL;
    }
    int ok = ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) : SSL_CTX_set_default_verify_paths(ctx);
    if (ok != 1) {
        snprintf(err, errlen, "--tls-ca %s: no usable PEM CA certificate (%s)",
                 ca_file ? ca_file : "(system default)", ssl_error_text(why, sizeof why));
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    return ctx;
}

struct bufferevent *dsp_tls_connect_bev_new(struct event_base *base, SSL_CTX *ctx, const char *host)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl)
        return NULL;
    unsigned char addr[sizeof(struct in6_addr)];
    int ok;
    if (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1) {
        /* An address is matched against the certificate's IP entries; SNI
         * carries DNS names only. */
        ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
    } else {
        ok = SSL_set1_host(ssl, host) == 1 && SSL_set_tlsext_host_name(ssl, host) == 1;
    }
    if (!ok) {
        SSL_free(ssl);
        ERR_clear_error();
        return NULL;
    }
    struct bufferevent *bev =
        bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, BEV_OPT_CLOSE_ON_FREE);
    if (bev)
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

int dsp_tls_error_text(struct bufferevent *bev, char *buf, size_t len)
{
    /* libevent keeps the failure's OpenSSL errors with the bufferevent, after
     * the SSL_get_error code (a small number, not an error of any library);
     * they come out newest first, and the oldest says most. */
    unsigned long e, root = 0;
    while ((e = bufferevent_get_openssl_error(bev)) != 0)
        if (ERR_GET_LIB(e) != 0)
            root = e;
    if (!root)
        return 0;
    char text[256];
    ERR_error_string_n(root, text, sizeof text);
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (v != X509_V_OK)
        snprintf(buf, len, "TLS: %s (%s)", text, X509_verify_cert_error_string(v));
    else
        snprintf(buf, len, "TLS: %s", text);
    return 1;
}

void dsp_tls_event_text(struct bufferevent *bev, short what, char *buf, size_t len)
{
    int errsave = EVUTIL_SOCKET_ERROR();
    if (dsp_tls_error_text(bev, buf, len) && !(what & BEV_EVENT_EOF))
        return;
    if (what & BEV_EVENT_EOF)
        snprintf(buf, len, "disconnected");
    else
        snprintf(buf, len, "socket error: %s", evutil_socket_error_to_string(errsave));
}
