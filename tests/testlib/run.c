/* run: see run.h. */
#include "run.h"
#include "wait.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int tp_run(const char *const *argv, const char *stdin_path, char *out, size_t cap, int limit_ms)
{
    char path[256];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int status = 0, fd;
    pid_t pid, r;
    long long end;
    ssize_t n;

    if (cap == 0)
        return -1;
    out[0] = '\0';
    /* A file, not a pipe: a chatty child never blocks on a full pipe while we wait. */
    snprintf(path, sizeof path, "%s/tp-run-%d-XXXXXX", tmp, (int)getpid());
    fd = mkstemp(path);
    if (fd < 0)
        return -1;
    close(fd);
    pid = fork();
    if (pid < 0) {
        unlink(path);
        return -1;
    }
    if (pid == 0) {
        int in = open(stdin_path ? stdin_path : "/dev/null", O_RDONLY);
        fd = open(path, O_WRONLY | O_TRUNC);
        if (in < 0 || fd < 0)
            _exit(126);
        dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        close(in);
        close(fd);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (end = tp_mono_ms() + limit_ms;;) {
        r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 || tp_mono_ms() >= end) {
            fprintf(stderr, "%s did not exit within %d ms; killed\n", argv[0], limit_ms);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            status = -1;
            break;
        }
        tp_sleep_ms(10);
    }
    fd = open(path, O_RDONLY);
    if (fd >= 0) {
        n = read(fd, out, cap - 1);
        out[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    unlink(path);
    int rc = status < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    printf("#");
    for (int i = 0; argv[i]; i++)
        printf(" %s", argv[i]);
    printf("%s%s -> %d\n", stdin_path ? " < " : "", stdin_path ? stdin_path : "", rc);
    for (char *line = out, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        printf("#   %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
        if (!nl)
            break;
    }
    return rc;
}
