/* dashboard.c: serves the embedded dashboard page (see dashboard.h). */
#include "dashboard.h"

#include "admin_http.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <jansson.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* From dashboard_html.c, which embed.py generates from dashboard.html. */
extern const unsigned char dsp_dashboard_page[];
extern const size_t dsp_dashboard_page_len;
extern const char dsp_dashboard_csp[];

/* The page's element that carries the first figures: they go right after this. */
#define FIRST_MARK "<pre id=\"tp-first\" hidden>"

/* Appends text HTML-escaped: the figures hold names a peer chose, which must stay text. */
static int add_escaped(struct evbuffer *out, const char *s)
{
    const char *run = s;
    int rc = 0;
    for (; *s && rc == 0; s++) {
        const char *esc = *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : *s == '&' ? "&amp;" : NULL;
        if (!esc)
            continue;
        rc = evbuffer_add(out, run, (size_t)(s - run)) | evbuffer_add(out, esc, strlen(esc));
        run = s + 1;
    }
    return rc | evbuffer_add(out, run, strlen(run));
}

/* The page with what /stats, /workers and /history answer now inside FIRST_MARK, so that
 * the page draws them before its load event (a screenshot taken at once shows figures,
 * not placeholders). The page as built when that cannot be made. */
static int add_page(struct evbuffer *out, void *srv)
{
    const char *page = (const char *)dsp_dashboard_page;
    const char *mark = memmem(page, dsp_dashboard_page_len, FIRST_MARK, strlen(FIRST_MARK));
    json_t *first = mark ? dsp_admin_first_json(srv) : NULL;
    char *text = first ? json_dumps(first, JSON_COMPACT) : NULL;
    json_decref(first);
    if (!text)
        return evbuffer_add_reference(out, dsp_dashboard_page, dsp_dashboard_page_len, NULL, NULL);
    size_t head = (size_t)(mark - page) + strlen(FIRST_MARK);
    int rc = evbuffer_add_reference(out, page, head, NULL, NULL) | add_escaped(out, text) |
             evbuffer_add_reference(out, page + head, dsp_dashboard_page_len - head, NULL, NULL);
    free(text);
    return rc;
}


void dsp_dashboard_serve(struct evhttp_request *req, void *arg)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_add_header(h, "Allow", "GET");
        evhttp_send_error(req, 405, "use GET");
        return;
    }
    struct evbuffer *out = evbuffer_new();
    if (!out || add_page(out, arg) != 0) {
        if (out)
            evbuffer_free(out);
        evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
        return;
    }
    evhttp_add_header(h, "Content-Type", "text/html; charset=utf-8");
    evhttp_add_header(h, "Cache-Control", "no-store");
    evhttp_add_header(h, "Content-Security-Policy", dsp_dashboard_csp);
    evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
    evhttp_add_header(h, "X-Frame-Options", "DENY");
    evhttp_add_header(h, "Referrer-Policy", "no-referrer");
    evhttp_send_reply(req, HTTP_OK, "OK", out);
    evbuffer_free(out);
}
