/* options.h: option checks, the address list, error texts, and the small pure
 * helpers (clock, jitter) of options.c, which every other file of libtaskpush may
 * use: it needs none of them. */
#ifndef TASKPUSH_WC_OPTIONS_H
#define TASKPUSH_WC_OPTIONS_H

#include "taskpush.h"

#include <stddef.h>
#include <stdint.h>

/* One "host:port" of tp_worker_options.addresses. A host is a DNS name or an
 * address (an IPv6 address without its brackets). */
typedef struct tpi_addr {
    char host[256];
    char port[6];
} tpi_addr;

/* Fills *err (when not NULL) with code and a formatted reason; returns code. */
int tpi_error_set(tp_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copies the fields of in that its version knows into out, defaults for the
 * rest; returns 0, or TP_EINVAL (NULL, unknown version) with the reason in *err. */
int tpi_options_copy(const tp_worker_options *in, tp_worker_options *out, tp_error *err);

/* Checks every field of opts (a copy made by tpi_options_copy); returns 0 or
 * TP_EINVAL with the reason in *err. */
int tpi_options_check(const tp_worker_options *opts, tp_error *err);

/* Parses "host:port[,host:port...]" into a new array (caller frees) of *n
 * entries. Returns 0, TP_EINVAL with the reason in *err, or TP_ENOMEM. */
int tpi_addr_parse(const char *list, tpi_addr **out, size_t *n, tp_error *err);

/* The delay before reconnect attempt number failures (0 for the first after a
 * success): min * 2^failures capped at max, with "equal jitter" (between half
 * of it and all of it), drawn from *rng. */
uint32_t tpi_backoff_ms(uint64_t *rng, uint32_t min, uint32_t max, unsigned failures);

/* Advances a xorshift64* generator; the state must not be 0. */
uint64_t tpi_rand(uint64_t *state);

/* The monotonic clock in nanoseconds. */
int64_t tpi_now_ns(void);

#endif
