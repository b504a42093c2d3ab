/* dashboard.c: serves the embedded dashboard page (see dashboard.h). */
#include "dashboard.h"

#include <event2/buffer.h>
#include <event2/http.h>

#include <stddef.h>

/* From dashboard_html.c, which embed.py generates from dashboard.html. */
extern const unsigned char dsp_dashboard_page[];
extern const size_t dsp_dashboard_page_len;
extern const char dsp_dashboard_csp[];

void dsp_dashboard_serve(struct evhttp_request *req, void *arg)
{
    (void)arg;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_add_header(h, "Allow", "GET");
        evhttp_send_error(req, 405, "use GET");
        return;
    }
    struct evbuffer *out = evbuffer_new();
    if (!out || evbuffer_add_reference(out, dsp_dashboard_page, dsp_dashboard_page_len, NULL, NULL) != 0) {
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
