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

/* Descriptors kept for the database's connections (each thread's, and a reconnect of
 * each while its old socket closes) and the admin listener's backlog, which evhttp
 * accepts in one pass before the admin cap closes the excess; then a margin for
 * listeners, logs, the ready file. */
#define DB_FD_RESERVE 32
#define ADMIN_BACKLOG 128
#define FD_MARGIN 64

/* Lets the daemon hold --max-connections workers and --admin-max-connections admin
 * connections and still open the database's: the soft descriptor limit (often 1024) is
 * raised as far as the hard one allows. When the hard limit is lower, --max-connections
 * is lowered to fit, so that the worker listener refuses (server.c) before workers eat
 * the descriptors a database reconnect needs. */
static void raise_fd_limit(dsp_config *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    int64_t others = cfg->admin_max_connections + ADMIN_BACKLOG + DB_FD_RESERVE + FD_MARGIN;
    rlim_t need = (rlim_t)(cfg->max_connections + others);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || need < rl.rlim_max ? need : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        int64_t fit = (int64_t)rl.rlim_cur - others;
        if (fit < 1)
            fit = 1;
        fprintf(stderr, "taskpushd: the descriptor limit is %llu: --max-connections lowered from %lld"
                " to %lld, so that the admin port and the database keep theirs\n",
                (unsigned long long)rl.rlim_cur, (long long)cfg->max_connections, (long long)fit);
        cfg->max_connections = fit;
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

    raise_fd_limit(&cfg);
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
        status = dsp_migrate_run(&cfg.db_url, cfg.table, stdout, stderr);
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
