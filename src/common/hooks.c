/* hooks.c — see hooks.h. The one file that reads ctune's own variables (dist.c
 * reads the launcher's: RANK, WORLD_SIZE, ...). */
#include "hooks.h"

#include <pthread.h>
#include <stdlib.h>

static ct_hooks hooks;
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

/* A variable's value, NULL when unset or empty. */
static const char *env_value(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void hooks_read(void)
{
    hooks.trace_dir = env_value("CTUNE_TRACE");
    hooks.inject_nan_step = env_value("CTUNE_INJECT_NAN_STEP");
    const char *pin = env_value("CTUNE_INJECT_PIN_FAIL");
    hooks.inject_pin_fail = pin && *pin == '1';
    const char *host = env_value("CTUNE_DIST_HOST_REDUCE");
    hooks.dist_host_reduce = host && *host == '1';
    hooks.inject_rank_fault = env_value("CTUNE_INJECT_RANK_FAULT");
}

const ct_hooks *hooks_get(void)
{
    pthread_once(&hooks_once, hooks_read);
    return &hooks;
}
