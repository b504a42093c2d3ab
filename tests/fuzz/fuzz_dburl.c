/* fuzz_dburl.c: libFuzzer target of the --db URL parser (dsp_db_url_parse)
 * and of the HOST:PORT splitter it uses (dsp_hostport_parse).
 *
 * The input, up to its first NUL, is the URL as given on the command line.
 * Any broken promise calls abort():
 *  - a refused URL leaves a reason in err and every field NULL;
 *  - an accepted one has a non-empty user, host and database name, the
 *    database name only of [A-Za-z0-9_$], a port from 0 (none) to 65535, a
 *    socket only without a port, and never a bracketed host;
 *  - the URL put back together from the parsed fields parses to the same
 *    fields (nothing is lost or shifted between user, password and host);
 *  - HOST:PORT accepted means a port of at most 65535 and a host that fits.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* check(cond): abort, naming the broken promise, when cond is false. */
#define check(cond) ((cond) ? (void)0 : fail(__LINE__, #cond))

static void fail(int line, const char *what)
{
    fprintf(stderr, "fuzz_dburl.c:%d: check failed: %s\n", line, what);
    abort();
}

static int same(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

static void check_fields(const dsp_db_url *u)
{
    check(u->user && u->user[0] && u->host && u->host[0] && u->dbname && u->dbname[0]);
    check(u->host[0] != '[');
    for (const char *c = u->dbname; *c; c++)
        check(isalnum((unsigned char)*c) || *c == '_' || *c == '$');
    check(u->port <= 65535);
    check(u->socket == NULL || (u->port == 0 && u->socket[0]));
}

/* check_roundtrip: the URL rebuilt from u parses to u again. */
static void check_roundtrip(const dsp_db_url *u)
{
    size_t n = 64 + strlen(u->user) + strlen(u->host) + strlen(u->dbname) +
               (u->password ? strlen(u->password) : 0) + (u->socket ? strlen(u->socket) : 0);
    char *url = malloc(n);
    char port[16] = "";
    char err[256];
    dsp_db_url again;
    int host_v6 = strchr(u->host, ':') != NULL;

    check(url != NULL);
    if (u->port)
        snprintf(port, sizeof port, ":%u", u->port);
    snprintf(url, n, "mysql://%s%s%s@%s%s%s%s/%s%s%s", u->user, u->password ? ":" : "",
             u->password ? u->password : "", host_v6 ? "[" : "", u->host, host_v6 ? "]" : "", port,
             u->dbname, u->socket ? "?socket=" : "", u->socket ? u->socket : "");
    check(dsp_db_url_parse(url, &again, err, sizeof err) == 0);
    check(same(u->user, again.user) && same(u->password, again.password) &&
          same(u->host, again.host) && u->port == again.port && same(u->dbname, again.dbname) &&
          same(u->socket, again.socket));
    dsp_db_url_clear(&again);
    free(url);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    char err[512];
    dsp_db_url u;
    char host[256];
    unsigned port = 0;

    check(s != NULL);
    if (size)
        memcpy(s, data, size);
    s[size] = '\0';

    err[0] = '\0';
    if (dsp_db_url_parse(s, &u, err, sizeof err) == 0) {
        check_fields(&u);
        check_roundtrip(&u);
        dsp_db_url_clear(&u);
    } else {
        check(err[0] != '\0');
        check(!u.user && !u.password && !u.host && !u.socket && !u.dbname && u.port == 0);
    }

    memset(host, 'x', sizeof host);
    if (dsp_hostport_parse(s, host, sizeof host, &port) == 0)
        check(port <= 65535 && memchr(host, '\0', sizeof host) != NULL);
    free(s);
    return 0;
}
