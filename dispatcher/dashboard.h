/* dashboard.h: the live dashboard of the admin port.
 *
 * The page (dispatcher/dashboard.html, embedded at build time by embed.py) is one
 * self-contained HTML file: inline CSS and JS, nothing loaded from elsewhere. It
 * polls GET /stats and GET /workers of the same port every second and draws the
 * throughput and the queue depth of the last five minutes, the headline figures
 * and the table of workers. */
#ifndef DSP_DASHBOARD_H
#define DSP_DASHBOARD_H

struct evhttp_request;

/* Answers GET / and GET /index.html (the admin port routes both here): the embedded
 * page (text/html; charset=utf-8, Cache-Control: no-store, and a
 * Content-Security-Policy that allows only the page's own inline script and style
 * and fetches from the same origin). Any other method gets 405. arg is the server: the
 * page carries what GET /stats, /workers and /history answer at the time
 * (dsp_admin_first_json), HTML-escaped, so that it draws them before it has loaded. */
void dsp_dashboard_serve(struct evhttp_request *req, void *arg);

#endif
