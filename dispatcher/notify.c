/* notify: see notify.h. The one place that talks to systemd, so that a build without
 * libsystemd (-Dsystemd=disabled, or not installed) only loses this file's body. */
#include "notify.h"

#ifdef TASKPUSH_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

void dsp_notify(const char *state)
{
#ifdef TASKPUSH_HAVE_LIBSYSTEMD
    (void)sd_notify(0, state);
#else
    (void)state;
#endif
}
