/* noise_probe: how steady is this machine? Times the same two pieces of work again and
 * again on an otherwise idle machine: random reads over 64 MiB (more than a last-level
 * cache, so each read goes to memory, as a database's index lookups do) and a chain of
 * multiplications that never leaves the registers. On a dedicated machine both take the
 * same time every sample; on a shared virtual machine the first moves with what the
 * host's other guests do to the memory system, and the bench's figures move with it
 * (README.md here, "Other tools"; the measurements: docs/journal/bench.md, "How steady the
 * machine is").
 *
 * usage: noise-probe [SAMPLES [INTERVAL_MS]]   (default 60 samples, 500 ms apart)
 * Prints one line per sample and a summary of each series. Run it with nothing else
 * running; it uses one core while it times.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TABLE_WORDS = 8u << 20, MEM_READS = 4000000, ALU_STEPS = 30000000, MAX_SAMPLES = 100000 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Random reads: each address comes from a linear congruential step, so the hardware
 * cannot prefetch it. Returns a value that depends on every read, so none is skipped. */
static uint64_t memory_work(const uint64_t *table)
{
    uint64_t x = 1, sum = 0;
    for (unsigned i = 0; i < MEM_READS; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        sum += table[(x >> 20) & (TABLE_WORDS - 1)];
    }
    return sum;
}

static uint64_t alu_work(void)
{
    uint64_t h = 14695981039346656037ull;
    for (uint64_t i = 0; i < ALU_STEPS; i++)
        h = (h ^ i) * 1099511628211ull;
    return h;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void summary(const char *name, double *v, unsigned n)
{
    double sum = 0, sq = 0;
    for (unsigned i = 0; i < n; i++)
        sum += v[i];
    double mean = sum / n;
    for (unsigned i = 0; i < n; i++)
        sq += (v[i] - mean) * (v[i] - mean);
    qsort(v, n, sizeof *v, cmp_double);
    printf("%s ms: min %.1f median %.1f max %.1f, min/max %.2f, cv %.3f\n", name, v[0], v[n / 2],
           v[n - 1], v[0] / v[n - 1], sqrt(sq / n) / mean);
}

static int parse_unsigned(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (unsigned)v;
    return 0;
}

int main(int argc, char **argv)
{
    unsigned samples = 60, interval_ms = 500;

    if (argc > 3 || (argc > 1 && parse_unsigned(argv[1], 2, MAX_SAMPLES, &samples) < 0) ||
        (argc > 2 && parse_unsigned(argv[2], 0, 60000, &interval_ms) < 0)) {
        fprintf(stderr, "usage: noise-probe [SAMPLES (2-%u) [INTERVAL_MS (0-60000)]]\n",
                (unsigned)MAX_SAMPLES);
        return 2;
    }
    uint64_t *table = malloc((size_t)TABLE_WORDS * sizeof *table);
    double *mem = malloc(samples * sizeof *mem), *alu = malloc(samples * sizeof *alu);
    if (table == NULL || mem == NULL || alu == NULL) {
        fprintf(stderr, "noise-probe: out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < TABLE_WORDS; i++)
        table[i] = i * 2654435761u;
    uint64_t sink = 0; /* printed at the end, so the compiler may not drop the work */
    double start = now_s();
    printf("# seconds memory_ms alu_ms\n");
    for (unsigned s = 0; s < samples; s++) {
        double t0 = now_s();
        sink += memory_work(table);
        double t1 = now_s();
        sink += alu_work();
        double t2 = now_s();
        mem[s] = (t1 - t0) * 1e3;
        alu[s] = (t2 - t1) * 1e3;
        printf("%.1f %.1f %.1f\n", t0 - start, mem[s], alu[s]);
        fflush(stdout);
        sleep_ms(interval_ms);
    }
    summary("memory", mem, samples);
    summary("alu", alu, samples);
    printf("# checksum %016" PRIx64 "\n", sink);
    free(table);
    free(mem);
    free(alu);
    return 0;
}
