/* interrupt.c — see interrupt.h. The handler only sets a flag and writes a
 * fixed message with write(2) (both async-signal-safe); the training loop polls
 * the flag between steps, so no step is ever cut in half and the checkpoint
 * written afterwards is as exact as a periodic one. */
#include "interrupt.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t pending;
static struct sigaction old_int, old_term;

static void on_signal(int sig)
{
    if (pending) {
        static const char msg[] = "\nctune: second signal: aborting without saving\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)ignored;
        _exit(128 + sig);
    }
    pending = sig;
    static const char msg[] = "\nctune: stopping after this step and saving a checkpoint "
                              "(interrupt again to abort without saving)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
}

void interrupt_install(void)
{
    pending = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* the loader's and the writers' system calls carry on */
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
}

void interrupt_restore(void)
{
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
}

int interrupt_pending(void) { return pending; }

int interrupt_fail(ct_error *err, int sig, const char *output_dir, long long step)
{
    ct_fail(err, 128 + sig, "interrupted by %s after step %lld; checkpoint saved in %s/checkpoint-%lld "
            "(run the same command to resume)", sig == SIGTERM ? "SIGTERM" : "SIGINT", step, output_dir, step);
    return 128 + sig;
}
