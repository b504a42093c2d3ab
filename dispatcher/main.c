/* taskpushd: wiring only. Settings come from config.c, the loop from server.c. */
#include "config.h"
#include "migrate.h"
#include "notify.h"
#include "server.h"

#include <event2/thread.h>
#include <mysql.h>

#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>

/* Lets the daemon hold --max-connections workers: the soft descriptor limit (often 1024)
 * is raised as far as the hard one allows. Past it, accept() fails with EMFILE and the
 * listener backs off (server.c). */
static void raise_fd_limit(int64_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t need = (rlim_t)want + 64; /* database connections, listeners, logs */
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || need < rl.rlim_max ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    dsp_config cfg;
    char err[512] = "";
    int rc = dsp_config_load(&cfg, argc, argv, stdout, err, sizeof err);
    if (rc != DSP_CONFIG_OK) {
        if (rc == DSP_CONFIG_BAD)
            fprintf(stderr, "taskpushd: %s\nTry 'taskpushd --help'.\n", err);
        dsp_config_free(&cfg);
        return rc == DSP_CONFIG_EXIT_OK ? 0 : 2;
    }

    raise_fd_limit(cfg.max_connections);
    /* A worker that vanishes mid-write must cost an EPIPE, not the process. */
    signal(SIGPIPE, SIG_IGN);
    /* The database threads wake the loop with event_active. */
    if (evthread_use_pthreads() < 0 || mysql_library_init(0, NULL, NULL) != 0) {
        fprintf(stderr, "taskpushd: cannot initialise libevent threads or the MySQL library\n");
        dsp_config_free(&cfg);
        return 1;
    }

    int status = 1;
    if (cfg.migrate) {
        status = dsp_migrate_run(&cfg.db_url, stdout, stderr);
    } else {
        dsp_server srv;
        if (dsp_server_init(&srv, &cfg) == 0) {
            dsp_notify("READY=1"); /* both ports are open (and the ready file written) */
            status = dsp_server_run(&srv);
        }
        dsp_server_free(&srv);
    }
    mysql_library_end();
    dsp_config_free(&cfg);
    return status;
}
