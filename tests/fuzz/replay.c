/* replay.c: runs a libFuzzer target without libFuzzer.
 *
 * Usage: fuzz_frame_replay PATH...
 * Each PATH is a file, or a directory whose regular files (not dotfiles) are
 * read in name order. Every file is passed once to LLVMFuzzerTestOneInput, in a
 * heap buffer of exactly its size. A target that finds a bug aborts; otherwise
 * the exit status is 0, or 1 when a path could not be read or no file was run.
 * This lets a gcc build (and CI) replay the seed corpus and any crash file.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* run_file feeds one file to the target. Returns 0, or -1 when it cannot be read. */
static int run_file(const char *path)
{
    int rc = -1;
    FILE *f = NULL;
    uint8_t *data = NULL;
    struct stat st;
    size_t size;

    errno = 0;
    f = fopen(path, "rb");
    if (f == NULL || fstat(fileno(f), &st) != 0)
        goto err;
    size = (size_t)st.st_size;
    data = malloc(size > 0 ? size : 1); /* never NULL for an empty input */
    if (data == NULL || fread(data, 1, size, f) != size)
        goto err;
    LLVMFuzzerTestOneInput(data, size);
    rc = 0;
    goto done;
err:
    fprintf(stderr, "replay: %s: %s\n", path, errno ? strerror(errno) : "short read");
done:
    free(data);
    if (f != NULL)
        fclose(f);
    return rc;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* run_dir feeds every regular file of dir, in name order; *count grows by the
 * files run. Returns 0, or -1 when something could not be read. */
static int run_dir(const char *dir, size_t *count)
{
    int rc = -1;
    DIR *d = NULL;
    struct dirent *e;
    char **names = NULL;
    size_t n = 0;
    size_t cap = 0;
    char path[4096];
    struct stat st;

    d = opendir(dir);
    if (d == NULL)
        goto err;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            char **bigger = realloc(names, (cap ? cap * 2 : 64) * sizeof(*names));

            if (bigger == NULL)
                goto err;
            names = bigger;
            cap = cap ? cap * 2 : 64;
        }
        names[n] = strdup(e->d_name);
        if (names[n] == NULL)
            goto err;
        n++;
    }
    qsort(names, n, sizeof(*names), cmp_names);
    rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (snprintf(path, sizeof(path), "%s/%s", dir, names[i]) >= (int)sizeof(path) ||
            stat(path, &st) != 0) {
            fprintf(stderr, "replay: cannot stat %s/%s\n", dir, names[i]);
            rc = -1;
            continue;
        }
        if (!S_ISREG(st.st_mode))
            continue;
        if (run_file(path) != 0)
            rc = -1;
        else
            (*count)++;
    }
    goto done;
err:
    fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
done:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (d != NULL)
        closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    int failed = 0;
    size_t count = 0;
    struct stat st;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        errno = 0;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            failed = 1;
        } else if (S_ISDIR(st.st_mode)) {
            failed |= run_dir(argv[i], &count) != 0;
        } else {
            if (run_file(argv[i]) == 0)
                count++;
            else
                failed = 1;
        }
    }
    printf("replay: %zu inputs run, %s\n", count, failed ? "some unreadable" : "no crash");
    return failed || count == 0;
}
