/* exec.c: one command per task, for taskpush-worker (see exec.h). */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long the pipes may stay open after the command's first process exited
 * (background children holding them) before the group is killed. */
#define PIPE_LINGER_MS 500

#define CHUNK 65536

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* A growing byte buffer; keep_tail makes it keep only the last `max` bytes. */
typedef struct buf {
    char *p;
    size_t len;
    size_t cap;
    size_t max;
    int keep_tail;
    int truncated;
} buf;

static int buf_add(buf *b, const char *data, size_t n)
{
    if (b->keep_tail) {
        if (n >= b->max) {
            data += n - b->max;
            n = b->max;
            b->len = 0;
        } else if (b->len + n > b->max) {
            size_t drop = b->len + n - b->max;

            memmove(b->p, b->p + drop, b->len - drop);
            b->len -= drop;
        }
    } else if (b->len + n > b->max) {
        b->truncated = 1;
        n = b->max - b->len;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *p;

        while (cap < b->len + n + 1)
            cap *= 2;
        if (cap > b->max + 1)
            cap = b->max + 1;
        p = realloc(b->p, cap);
        if (p == NULL)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

/* drain reads what fd has into b; closes fd at EOF or on an error. */
static void drain(int *fd, buf *b)
{
    char chunk[CHUNK];

    for (;;) {
        ssize_t n = read(*fd, chunk, sizeof(chunk));

        if (n > 0) {
            if (buf_add(b, chunk, (size_t)n) < 0)
                b->truncated = 1; /* out of memory: keep what we have */
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        close_fd(fd); /* EOF or error */
        return;
    }
}

/* feed writes as much of the input as the pipe takes; closes fd when done. */
static void feed(int *fd, const char *input, size_t len, size_t *off)
{
    while (*off < len) {
        ssize_t n = write(*fd, input + *off, len - *off);

        if (n > 0) {
            *off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        break; /* EPIPE: the command does not read its input */
    }
    close_fd(fd);
}

/* Progress lines as they come: a partial line waits for its newline; a line longer than
 * TPW_PROGRESS_LINE_MAX is skipped up to its newline. */
typedef struct lines {
    char b[TPW_PROGRESS_LINE_MAX];
    size_t len;
    int skipping;
} lines;

int tpw_exec_progress_line(const char *line, size_t len, tpw_exec_progress_fn fn, void *arg)
{
    static const char word[] = "progress ";
    char text[257];
    unsigned v = 0;
    size_t i = sizeof word - 1, digits = 0;

    if (len < i || memcmp(line, word, i) != 0)
        return 0;
    while (i < len && line[i] >= '0' && line[i] <= '9' && digits < 5) {
        v = v * 10 + (unsigned)(line[i++] - '0');
        digits++;
    }
    if (digits == 0 || v > 1000 || (i < len && line[i] != ' '))
        return 0;
    if (i < len)
        i++; /* the space before the text */
    if (len - i > sizeof text - 1 || memchr(line + i, '\0', len - i) != NULL)
        return 0;
    memcpy(text, line + i, len - i);
    text[len - i] = '\0';
    fn(arg, v, text);
    return 1;
}

/* read_lines reads what fd has and hands each whole line to req->progress; closes fd at
 * EOF or on an error. */
static void read_lines(int *fd, lines *l, const tpw_exec_req *req)
{
    char chunk[CHUNK];

    for (;;) {
        ssize_t n = read(*fd, chunk, sizeof(chunk));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            close_fd(fd); /* EOF or error; a last line without a newline is dropped */
            return;
        }
        for (ssize_t k = 0; k < n; k++) {
            char c = chunk[k];
            if (c == '\n') {
                if (!l->skipping)
                    tpw_exec_progress_line(l->b, l->len, req->progress, req->progress_arg);
                l->len = 0;
                l->skipping = 0;
            } else if (!l->skipping && l->len < sizeof l->b) {
                l->b[l->len++] = c;
            } else {
                l->skipping = 1;
                l->len = 0;
            }
        }
    }
}

static int spawn(const tpw_exec_req *req, int in_r, int out_w, int err_w, int prog_w, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none;
    sigset_t dfl;
    char *argv[] = {"sh", "-c", (char *)req->command, NULL};
    int e;

    if ((e = posix_spawn_file_actions_init(&fa)) != 0)
        return e;
    if ((e = posix_spawnattr_init(&attr)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        return e;
    }
    sigemptyset(&none);
    sigemptyset(&dfl);
    /* The worker ignores SIGPIPE and blocks it in its threads; the command
     * gets the usual defaults and an empty mask. */
    sigaddset(&dfl, SIGPIPE);
    sigaddset(&dfl, SIGINT);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGHUP);
    sigaddset(&dfl, SIGQUIT);
    if ((e = posix_spawn_file_actions_adddup2(&fa, in_r, STDIN_FILENO)) == 0 &&
        (e = posix_spawn_file_actions_adddup2(&fa, out_w, STDOUT_FILENO)) == 0 &&
        (e = posix_spawn_file_actions_adddup2(&fa, err_w, STDERR_FILENO)) == 0 &&
        (prog_w < 0 || (e = posix_spawn_file_actions_adddup2(&fa, prog_w, TPW_PROGRESS_FD)) == 0) &&
        (e = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                 POSIX_SPAWN_SETSIGDEF)) == 0 &&
        (e = posix_spawnattr_setpgroup(&attr, 0)) == 0 &&
        (e = posix_spawnattr_setsigmask(&attr, &none)) == 0 &&
        (e = posix_spawnattr_setsigdefault(&attr, &dfl)) == 0)
        e = posix_spawn(pid, "/bin/sh", &fa, &attr, argv, req->envp);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    return e;
}

int tpw_exec_run(const tpw_exec_req *req, tpw_exec_res *res)
{
    int rc = 0;
    int in_p[2] = {-1, -1};
    int out_p[2] = {-1, -1};
    int err_p[2] = {-1, -1};
    int prog_p[2] = {-1, -1};
    lines prog = {.len = 0};
    pid_t pid = -1;
    buf out = {.max = req->out_max};
    buf err = {.max = req->err_max > 0 ? req->err_max : 1, .keep_tail = 1};
    size_t in_off = 0;
    int64_t start = now_ms();
    int64_t kill_at = 0;   /* SIGKILL due (after SIGTERM) */
    int64_t exited_at = 0; /* first process seen exited */
    int stage = 0;         /* 0 running, 1 SIGTERM sent, 2 SIGKILL sent */
    int sleep_ms = 1;
    unsigned check_ms = req->check_ms > 0 ? req->check_ms : 50;

    memset(res, 0, sizeof(*res));
    if (pipe2(in_p, O_CLOEXEC) < 0 || pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0) {
        rc = -errno;
        goto done;
    }
    if (req->progress != NULL) {
        if (pipe2(prog_p, O_CLOEXEC) < 0) {
            rc = -errno;
            goto done;
        }
        /* Above TPW_PROGRESS_FD: a dup2 onto the same number would keep close-on-exec. */
        if (prog_p[1] <= TPW_PROGRESS_FD) {
            int high = fcntl(prog_p[1], F_DUPFD_CLOEXEC, TPW_PROGRESS_FD + 1);
            if (high < 0) {
                rc = -errno;
                goto done;
            }
            close_fd(&prog_p[1]);
            prog_p[1] = high;
        }
    }
    rc = -spawn(req, in_p[0], out_p[1], err_p[1], prog_p[1], &pid);
    close_fd(&in_p[0]);
    close_fd(&out_p[1]);
    close_fd(&err_p[1]);
    close_fd(&prog_p[1]);
    if (rc < 0) {
        pid = -1;
        goto done;
    }
    set_nonblock(in_p[1]);
    set_nonblock(out_p[0]);
    set_nonblock(err_p[0]);
    if (prog_p[0] >= 0)
        set_nonblock(prog_p[0]);
    if (req->input_len == 0)
        close_fd(&in_p[1]);

    for (;;) {
        struct pollfd pf[4];
        nfds_t nf = 0;
        int64_t now = now_ms();
        int timeout = (int)check_ms;

        if (stage == 0 && req->check != NULL &&
            req->check(req->check_arg, res->why, sizeof(res->why))) {
            res->killed = 1;
            kill(-pid, SIGTERM);
            kill_at = now + req->kill_grace_ms;
            stage = 1;
        }
        if (stage == 1 && now >= kill_at) {
            kill(-pid, SIGKILL);
            stage = 2;
        }
        if (exited_at == 0) {
            siginfo_t si;

            memset(&si, 0, sizeof(si));
            /* WNOWAIT: the leader stays a zombie, so its pid (= the group id)
             * cannot be reused while we may still signal the group. */
            if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid)
                exited_at = now;
        }
        if (exited_at != 0 && out_p[0] < 0 && err_p[0] < 0 && prog_p[0] < 0)
            break;
        if (exited_at != 0 && now - exited_at >= PIPE_LINGER_MS) {
            kill(-pid, SIGKILL); /* background processes still hold the pipes */
            stage = 2;
            break;
        }
        if (in_p[1] >= 0)
            pf[nf++] = (struct pollfd){.fd = in_p[1], .events = POLLOUT};
        if (out_p[0] >= 0)
            pf[nf++] = (struct pollfd){.fd = out_p[0], .events = POLLIN};
        if (err_p[0] >= 0)
            pf[nf++] = (struct pollfd){.fd = err_p[0], .events = POLLIN};
        if (prog_p[0] >= 0)
            pf[nf++] = (struct pollfd){.fd = prog_p[0], .events = POLLIN};
        if (nf == 0 || exited_at != 0) {
            /* Waiting for an exit that poll cannot see: back off from 1 ms. */
            timeout = sleep_ms;
            sleep_ms = sleep_ms * 2 > (int)check_ms ? (int)check_ms : sleep_ms * 2;
        }
        if (stage == 1 && kill_at - now < timeout)
            timeout = kill_at - now > 0 ? (int)(kill_at - now) : 0;
        if (poll(nf > 0 ? pf : NULL, nf, timeout) < 0 && errno != EINTR) {
            rc = -errno;
            break;
        }
        for (nfds_t i = 0; i < nf; i++) {
            if (pf[i].revents == 0)
                continue;
            if (pf[i].fd == in_p[1])
                feed(&in_p[1], req->input, req->input_len, &in_off);
            else if (pf[i].fd == out_p[0])
                drain(&out_p[0], &out);
            else if (pf[i].fd == err_p[0])
                drain(&err_p[0], &err);
            else if (pf[i].fd == prog_p[0])
                read_lines(&prog_p[0], &prog, req);
        }
    }
    if (pid > 0 && (res->killed || rc < 0))
        kill(-pid, SIGKILL); /* whatever of the group survived SIGTERM */
done:
    if (pid > 0) {
        while (waitpid(pid, &res->status, 0) < 0 && errno == EINTR)
            ;
    }
    close_fd(&in_p[0]);
    close_fd(&in_p[1]);
    close_fd(&out_p[0]);
    close_fd(&out_p[1]);
    close_fd(&err_p[0]);
    close_fd(&err_p[1]);
    close_fd(&prog_p[0]);
    close_fd(&prog_p[1]);
    res->out = out.p;
    res->out_len = out.len;
    res->out_truncated = out.truncated;
    res->err = err.p;
    res->err_len = err.len;
    res->elapsed_ms = now_ms() - start;
    return rc;
}

void tpw_exec_res_free(tpw_exec_res *res)
{
    if (res == NULL)
        return;
    free(res->out);
    free(res->err);
    res->out = NULL;
    res->err = NULL;
}
