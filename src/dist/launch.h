/* launch.h — the supervisor behind `ctune train CONFIG --gpus N`: data-parallel
 * training runs one process per GPU, all of them this same binary, started and
 * watched by the process the user ran.
 *
 * Each child gets the launcher environment torchrun sets (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); with WORLD_SIZE set a
 * child refuses --gpus (cmd_train.c), so it never supervises again.
 *
 * Signals: SIGINT and SIGTERM sent to the supervisor are forwarded to every live
 * child (which finishes its step, saves and exits); the supervisor then waits
 * for them without a deadline. Children run in process groups of their own so
 * that a Ctrl-C at the terminal reaches them once, through the supervisor: the
 * trainer reads a second signal as "abort without saving". Children also get
 * SIGTERM when the supervisor dies (PR_SET_PDEATHSIG, which Linux ties to the
 * thread that forked: call launch_ranks from a thread that outlives the run). */
#ifndef CT_LAUNCH_H
#define CT_LAUNCH_H

#include "common.h"

typedef struct ct_launch_options {
    int ranks;                 /* N >= 1 child processes */
    char *const *argv;         /* the command each child runs (argv[0] a path, exec'd as is, no PATH search) */
    const char *log_dir;       /* ranks >= 1 write stdout to log_dir/rank-K.log (created, appended); NULL: inherit */
    double grace_s;            /* after the first failure, how long the others get to stop by themselves
                                  before SIGTERM, then SIGKILL after another grace_s */
    const char *master_addr;   /* NULL: "127.0.0.1" */
    int master_port;           /* 0: pick a free TCP port on 127.0.0.1 */
} ct_launch_options;

/* Runs opt->ranks copies of opt->argv and waits for all of them.
 *
 * GPUs: every child sees the GPUs this process sees and uses the LOCAL_RANK-th
 * (torchrun's convention); a CUDA_VISIBLE_DEVICES listing fewer than N is
 * CT_ERR_INPUT before anything starts ("--gpus 4: CUDA_VISIBLE_DEVICES lists 2
 * GPUs (0,1)").
 *
 * The first child to exit non-zero or die by a signal is the failure: it gets a
 * line on stderr ("ctune: rank K (pid P) exited with status S" or "... was killed
 * by signal SIGKILL"); the others get grace_s to notice the lost peer and exit,
 * then SIGTERM, then SIGKILL after another grace_s, each with a line ("ctune:
 * stopped rank J (pid P) after rank K failed"). After a forwarded signal no one
 * is stopped this way: ranks saving a checkpoint are left to finish.
 *
 * Returns 0 when every rank exited 0; else the failing rank's exit status (so a
 * rank's 2 for bad input reaches the user as 2) or 1 when a signal killed it,
 * with a one-line summary in err. Errors of its own (a log that cannot be
 * opened, fork failing) return CT_ERR_RUNTIME. No child is left running when it
 * returns, whatever the outcome. */
int launch_ranks(const ct_launch_options *opt, ct_error *err);

#endif
