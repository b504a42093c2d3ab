/* sb: a growing string for tests that build long SQL statements (multi-row INSERTs). */
#ifndef TASKPUSH_TESTS_SB_H
#define TASKPUSH_TESTS_SB_H

#include <stddef.h>

/* Zero it to start; s is NUL-terminated once anything was appended. */
struct tp_sb {
    char *s;
    size_t len, cap;
};

/* Appends the formatted text. Out of memory, or a format error, ends the test program
 * (abort with a message): a fixture that cannot build its statement cannot test. */
void tp_sb_printf(struct tp_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees the text and zeroes b. */
void tp_sb_free(struct tp_sb *b);

#endif
