/* fuzz_config.c: libFuzzer target of taskpushd's --config file parser.
 *
 * The input is the text of a --config file. It is applied, through
 * dsp_config_apply_file (the code dsp_config_load runs for --config), over the
 * defaults of a configuration loaded from a minimal command line, as a file
 * read with fmemopen (no file on disk: the fuzzer never opens a path). Then,
 * as dsp_config_load does next, the database URL is parsed and the settings are
 * listed as /stats shows them. Any broken promise calls abort():
 *  - a refused file leaves a reason in err;
 *  - an accepted one leaves every setting usable: HOST:PORT values split,
 *    numbers within the bounds the server relies on, durations not negative;
 *  - the listing has a value for every key and, when the URL has a
 *    password, does not show the URL.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* check(cond): abort, naming the broken promise, when cond is false. */
#define check(cond) ((cond) ? (void)0 : fail(__LINE__, #cond))

static void fail(int line, const char *what)
{
    fprintf(stderr, "fuzz_config.c:%d: check failed: %s\n", line, what);
    abort();
}

static void check_hostport(const char *s)
{
    char host[256];
    unsigned port = 0;

    check(s != NULL && dsp_hostport_parse(s, host, sizeof host, &port) == 0 && port <= 65535);
}

/* check_setting: every key has a value, and the password never shows. */
static void check_setting(void *arg, const char *key, const char *val)
{
    const dsp_config *cfg = arg;

    check(key != NULL && val != NULL);
    /* With a password, the URL is not shown in any form (its text is masked). */
    if (strcmp(key, "db") == 0 && cfg->db_url.password)
        check(strstr(val, "mysql://") == NULL && strstr(val, cfg->db) == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *argv[] = {"taskpushd", "--db", "mysql://fuzz@localhost/fuzz", NULL};
    dsp_config cfg;
    char err[512];
    FILE *f;
    int rc;

    /* The defaults alone must load. */
    check(dsp_config_load(&cfg, 3, argv, stderr, err, sizeof err) == DSP_CONFIG_OK);
    /* "r" reads size bytes, NULs included (glibc >= 2.22). */
    f = fmemopen((void *)(uintptr_t)(data ? data : (const uint8_t *)""), size, "r");
    check(f != NULL);
    err[0] = '\0';
    rc = dsp_config_apply_file(&cfg, f, "fuzz.conf", err, sizeof err);
    fclose(f);
    check(rc == 0 || rc == -1);
    if (rc < 0) {
        check(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
        dsp_config_free(&cfg);
        return 0;
    }
    check_hostport(cfg.listen);
    check_hostport(cfg.admin);
    check(cfg.scheduler == DSP_SCHED_ROUND_ROBIN || cfg.scheduler == DSP_SCHED_LEAST_LOADED);
    check(cfg.log_level >= DSP_LOG_ERROR && cfg.log_level <= DSP_LOG_DEBUG);
    check(cfg.batch >= 1 && cfg.poll_ms >= 1 && cfg.heartbeat_ms >= 1 && cfg.max_frame >= 64);
    check(cfg.task_timeout_ms >= 1 && cfg.prefetch >= 0 && cfg.shutdown_grace_ms >= 0);
    check(cfg.retain_finished_ms >= 0 && cfg.retain_failed_ms >= 0);
    check(cfg.db != NULL);

    /* What dsp_config_load does next with the file's db key. */
    dsp_db_url_clear(&cfg.db_url);
    if (dsp_db_url_parse(cfg.db, &cfg.db_url, err, sizeof err) == 0)
        dsp_config_each(&cfg, check_setting, &cfg);
    dsp_config_free(&cfg);
    return 0;
}
