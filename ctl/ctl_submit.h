/* ctl_submit.h: `taskpushctl submit` (ctl_submit.c), through the worker port. */
#ifndef TASKPUSH_CTL_SUBMIT_H
#define TASKPUSH_CTL_SUBMIT_H

/* Runs `taskpushctl ... submit ...` (the whole command line); returns the exit status. */
int ctl_submit_main(int argc, char **argv);

#endif
