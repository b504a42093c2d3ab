/* notify: tells the service manager how taskpushd is doing (sd_notify). */
#ifndef DSP_NOTIFY_H
#define DSP_NOTIFY_H

/* Sends STATE ("READY=1", "STOPPING=1") to systemd when taskpushd runs under a
 * Type=notify unit (NOTIFY_SOCKET set) and was built with libsystemd; otherwise does
 * nothing. Never fails: a manager that misses READY=1 times the start out itself. */
void dsp_notify(const char *state);

#endif
