/* chaos_net: the network pieces of the chaos suite, each a thread of the chaos process.
 *
 *   chaos_proxy    a TCP proxy between one honest worker and taskpushd's worker port, which
 *                  on command stops forwarding in both directions (reads nothing, writes
 *                  nothing, accepts nothing, closes nothing) and later heals: a partition.
 *   chaos_hostile  many hostile connections to the worker port, each of one kind (see
 *                  enum chaos_kind), each reconnecting after it is closed, at a bounded rate.
 *
 * Both only ever connect to and listen on 127.0.0.1. Not thread-safe beyond what each
 * function says: one controlling thread (the suite's main thread) calls them.
 */
#ifndef TASKPUSH_TESTS_CHAOS_NET_H
#define TASKPUSH_TESTS_CHAOS_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the partition proxy ---- */

typedef struct chaos_proxy chaos_proxy;

/* Listens on 127.0.0.1:0 and forwards every accepted connection to upstream
 * ("127.0.0.1:PORT"); writes the address it listens on into listen_out. Returns the
 * proxy (stop with chaos_proxy_stop), or NULL (message on stderr). */
chaos_proxy *chaos_proxy_start(const char *upstream, char *listen_out, size_t cap);

/* hold true: stop forwarding, bytes stay where they are (kernel buffers, the proxy's
 * own); false: heal. Takes effect within a few milliseconds. */
void chaos_proxy_hold(chaos_proxy *p, bool hold);

/* Connections accepted so far. */
uint64_t chaos_proxy_accepted(chaos_proxy *p);

/* Stops the thread, closes every socket, frees p. NULL is fine. */
void chaos_proxy_stop(chaos_proxy *p);

/* ---- the hostile mix ---- */

enum chaos_kind {
    CHAOS_GARBAGE = 0, /* 64 random bytes, then wait to be closed */
    CHAOS_LEN4G,       /* a length prefix of 0xFFFFFFFF, then silence */
    CHAOS_BIG,         /* a 16 MiB frame before HELLO, sent whole, then silence */
    CHAOS_SLOWLORIS,   /* 10 bytes of a 100-byte frame, then silence */
    CHAOS_IDLE,        /* a valid HELLO (a type no task has), then silence */
    CHAOS_CAP_NEG,     /* HELLO with capacity 0x80000000, then silence */
    CHAOS_CAP_MAX,     /* HELLO with capacity 0x7fffffff, then silence */
    CHAOS_TYPES64,     /* HELLO with 64 random task types, then silence */
    CHAOS_BAD_UTF8,    /* HELLO with the type 0xFF 0xFE, then silence */
    CHAOS_NUL_TYPE,    /* HELLO with a type holding a NUL byte, then silence */
    CHAOS_FLOOD,       /* connect and close at once, again and again */
    CHAOS_NKINDS
};

/* Every kind. */
#define CHAOS_ALL_KINDS ((1u << CHAOS_NKINDS) - 1)

/* The kind's name ("garbage", "len4g", ...), NULL for a bad value. */
const char *chaos_kind_name(int kind);

/* Parses "all" or a comma-separated list of kind names into a mask. Returns 0, or -1
 * (the bad name on stderr). */
int chaos_kinds_parse(const char *list, unsigned *mask);

typedef struct chaos_hostile chaos_hostile;

typedef struct chaos_hostile_stats {
    uint64_t connects;       /* connections established */
    uint64_t refused;        /* connects that failed (the dispatcher was down) */
    uint64_t closed_by_peer; /* established connections the dispatcher closed */
    uint64_t big_bytes;      /* bytes of 16 MiB frames the dispatcher took */
    unsigned open_peak;      /* most connections open at once */
    uint64_t per_kind[CHAOS_NKINDS]; /* connections established, by kind */
} chaos_hostile_stats;

/* Starts nslots hostile connections to target ("127.0.0.1:PORT"), the kinds of mask in
 * turn (at most 16 of CHAOS_BIG at once, the others take their place: each sends
 * 16 MiB). Every slot reconnects 100..300 ms after its connection ends (flood: every
 * 100 ms). seed makes the random bytes repeatable. Returns NULL on failure. */
chaos_hostile *chaos_hostile_start(const char *target, unsigned mask, unsigned nslots,
                                   unsigned seed);

/* Connections open now (approximate, read while the thread runs). */
unsigned chaos_hostile_open(chaos_hostile *h);

/* Stops the thread, closes every connection, fills *out (when not NULL), frees h. */
void chaos_hostile_stop(chaos_hostile *h, chaos_hostile_stats *out);

#endif
