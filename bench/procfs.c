/* procfs.c: reading /proc (procfs.h). */
#include "procfs.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

double procfs_cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    if (pid <= 0)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* The command name may hold spaces and ')': fields resume after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -1;
    unsigned long long ut = 0, st = 0;
    /* After ") ": state(3) ... utime is field 14, stime 15. */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(ut + st) / (double)hz : -1;
}

int procfs_status_value(pid_t pid, const char *key, char *buf, size_t len)
{
    char path[64], line[512];
    size_t klen = strlen(key);
    int rc = -1;
    if (pid <= 0 || len == 0)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0 || line[klen] != ':')
            continue;
        const char *v = line + klen + 1;
        v += strspn(v, " \t");
        size_t n = strcspn(v, "\n");
        if (n > 0 && n < len) {
            memcpy(buf, v, n);
            buf[n] = '\0';
            rc = 0;
        }
        break;
    }
    fclose(f);
    return rc;
}

long procfs_status_kb(pid_t pid, const char *key)
{
    char v[64];
    long kb;
    if (procfs_status_value(pid, key, v, sizeof v) < 0 || sscanf(v, "%ld kB", &kb) != 1)
        return -1;
    return kb;
}

long procfs_peak_rss_kb(pid_t pid, long seen_kb)
{
    long hwm = procfs_status_kb(pid, "VmHWM");
    return hwm < 0 ? -1 : hwm > seen_kb ? hwm : seen_kb;
}
