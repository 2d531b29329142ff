/* launch.c — see launch.h.
 *
 * The supervisor polls each child with waitpid(pid, WNOHANG) every 10 ms rather
 * than blocking in wait(): the grace timers and the forwarding of signals need
 * it awake, and waiting by pid never reaps a child that is not ours. Everything
 * a child needs (its environment, its log file) is prepared before fork, so
 * between fork and exec it makes only async-signal-safe calls (the process may
 * have other threads, whose locks fork copies held). A close-on-exec pipe tells
 * the parent whether exec worked, so "cannot run PATH" is the supervisor's own
 * clear error instead of a rank's mysterious exit code. */
#include "launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { POLL_MS = 10 };

/* The only state a signal handler can reach: how many SIGINT ([0]) and SIGTERM
 * ([1]) arrived. The wait loop forwards each one it has not forwarded yet. */
static volatile sig_atomic_t signals_seen[2];

static void on_signal(int sig) { signals_seen[sig == SIGTERM]++; }

typedef struct rank_proc {
    pid_t pid;
    bool running;    /* started and not reaped yet */
    int status;      /* waitpid status once reaped */
} rank_proc;

/* Variables we set for a child; a value they have in our environment is replaced. */
static const char *const launch_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
};
enum { N_LAUNCH_VARS = sizeof launch_vars / sizeof launch_vars[0] };

static bool is_launch_var(const char *entry)
{
    for (int i = 0; i < N_LAUNCH_VARS; i++) {
        size_t len = strlen(launch_vars[i]);
        if (strncmp(entry, launch_vars[i], len) == 0 && entry[len] == '=') return true;
    }
    return false;
}

/* One NAME=VALUE string, owned by the caller. */
__attribute__((format(printf, 1, 2)))
static char *env_entry(const char *fmt, ...)
{
    char buf[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ct_strdup(buf);
}

/* Our environment plus rank K's launcher variables, for execve (caller frees
 * with env_free). */
static char **env_for_rank(int rank, int world, const char *addr, int port)
{
    size_t n = 0;
    while (environ[n]) n++;
    char **env = ct_calloc(n + N_LAUNCH_VARS + 1, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_launch_var(environ[i])) env[k++] = ct_strdup(environ[i]);
    env[k++] = env_entry("RANK=%d", rank);
    env[k++] = env_entry("WORLD_SIZE=%d", world);
    env[k++] = env_entry("LOCAL_RANK=%d", rank);
    env[k++] = env_entry("LOCAL_WORLD_SIZE=%d", world);
    env[k++] = env_entry("MASTER_ADDR=%s", addr);
    env[k++] = env_entry("MASTER_PORT=%d", port);
    return env;
}

static void env_free(char **env)
{
    for (char **e = env; *e; e++) free(*e);
    free(env);
}

/* Every rank sees the GPUs we see and takes the LOCAL_RANK-th (as under
 * torchrun: NCCL's peer-to-peer paths need the peers' GPUs visible), so a
 * CUDA_VISIBLE_DEVICES with fewer entries than ranks is the user's mistake,
 * caught before any rank starts. */
static int check_visible_devices(int n, ct_error *err)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) return CT_OK;
    int count = *cvd != 0;
    for (const char *c = cvd; *c; c++) count += *c == ',';
    if (count < n)
        return CT_FAIL_INPUT(err, "--gpus %d: CUDA_VISIBLE_DEVICES lists %d GPU%s (%s)",
                             n, count, count == 1 ? "" : "s", cvd);
    return CT_OK;
}

/* Asks the kernel for a free port: bind port 0, read the one it chose, close.
 * Another process could take it before rank 0 binds it; the window is short,
 * and rank 0 would then fail with "address in use" rather than hang. */
static int pick_free_port(int *port, ct_error *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return CT_FAIL_RUNTIME(err, "cannot pick a master port: socket (%s)", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
    int e = errno;
    close(fd);
    if (!ok) return CT_FAIL_RUNTIME(err, "cannot pick a master port on 127.0.0.1 (%s)", strerror(e));
    *port = ntohs(sa.sin_port);
    return CT_OK;
}

/* In the child after fork: reports errno through the pipe and exits. */
static void child_fail(int report_fd)
{
    int e = errno;
    ssize_t ignored = write(report_fd, &e, sizeof e);
    (void)ignored;
    _exit(127);
}

/* Starts rank K: its own process group (see launch.h), SIGTERM when we die,
 * stdout to log_fd when that is >= 0, then exec. Returns once exec succeeded. */
static int spawn_rank(rank_proc *p, int rank, char *const *argv, char **env, int log_fd, ct_error *err)
{
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0)
        return CT_FAIL_RUNTIME(err, "rank %d: cannot create a pipe (%s)", rank, strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(report[0]);
        close(report[1]);
        return CT_FAIL_RUNTIME(err, "rank %d: fork failed (%s)", rank, strerror(e));
    }
    if (pid == 0) {
        setpgid(0, 0);
        /* Checking getppid after prctl closes the race of a parent that died
         * before the death signal was armed. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) child_fail(report[1]);
        if (log_fd >= 0 && dup2(log_fd, STDOUT_FILENO) < 0) child_fail(report[1]);
        execve(argv[0], argv, env);
        child_fail(report[1]);
    }
    p->pid = pid;
    p->running = true;
    close(report[1]);
    int e = 0;
    ssize_t got;
    do got = read(report[0], &e, sizeof e); while (got < 0 && errno == EINTR);
    close(report[0]);
    if (got != (ssize_t)sizeof e) return CT_OK; /* closed by exec: the command runs */
    while (waitpid(pid, &p->status, 0) < 0 && errno == EINTR) {}
    p->running = false;
    return CT_FAIL_RUNTIME(err, "rank %d: cannot run %s (%s)", rank, argv[0], strerror(e));
}

static bool status_failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

/* "exited with status 2" / "was killed by signal SIGKILL", into buf. */
static const char *describe_status(int status, char *buf, size_t len)
{
    if (WIFEXITED(status)) {
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
    } else {
        const char *name = sigabbrev_np(WTERMSIG(status));
        if (name) snprintf(buf, len, "was killed by signal SIG%s", name);
        else snprintf(buf, len, "was killed by signal %d", WTERMSIG(status));
    }
    return buf;
}

/* Reaps every rank that has exited; returns how many still run. The first
 * failing rank found becomes *failed when that is still -1. */
static int reap_ranks(rank_proc *p, int n, int *failed)
{
    int running = 0;
    for (int k = 0; k < n; k++) {
        if (!p[k].running) continue;
        pid_t r = waitpid(p[k].pid, &p[k].status, WNOHANG);
        if (r == 0 || (r < 0 && errno == EINTR)) { running++; continue; }
        /* r < 0 only if someone else reaped it: its status is lost, count it failed. */
        if (r < 0) p[k].status = 1 << 8;
        p[k].running = false;
        if (*failed < 0 && status_failed(p[k].status)) *failed = k;
    }
    return running;
}

static void signal_ranks(rank_proc *p, int n, int sig)
{
    for (int k = 0; k < n; k++)
        if (p[k].running) kill(p[k].pid, sig);
}

static void sleep_poll(void)
{
    struct timespec ts = {0, POLL_MS * 1000000L};
    nanosleep(&ts, NULL); /* a signal cuts it short, which only forwards it sooner */
}

/* Stops whatever ranks run after an error of our own: SIGTERM, up to grace_s
 * for them to exit, SIGKILL, reap. */
static void stop_all(rank_proc *p, int n, double grace_s)
{
    int ignored = -1;
    signal_ranks(p, n, SIGTERM);
    double until = ct_now() + grace_s;
    while (reap_ranks(p, n, &ignored) > 0 && ct_now() < until) sleep_poll();
    signal_ranks(p, n, SIGKILL);
    for (int k = 0; k < n; k++) {
        if (!p[k].running) continue;
        while (waitpid(p[k].pid, &p[k].status, 0) < 0 && errno == EINTR) {}
        p[k].running = false;
    }
}

/* Waits for every rank, forwarding signals, and after the first failure gives
 * the others grace_s, then SIGTERM, then after another grace_s SIGKILL. */
static int supervise(rank_proc *p, int n, double grace_s, const char *log_dir, ct_error *err)
{
    int failed = -1;
    int forwarded[2] = {0, 0};
    bool user_signal = false;  /* ranks are saving at the user's request: no deadlines */
    int escalation = 0;        /* signals sent since the failure: 0, SIGTERM (1), SIGKILL (2) */
    double deadline = 0;
    char what[96];
    for (;;) {
        for (int s = 0; s < 2; s++) {
            while (forwarded[s] != signals_seen[s]) {
                signal_ranks(p, n, s ? SIGTERM : SIGINT);
                forwarded[s]++;
                user_signal = true;
            }
        }
        int was_failed = failed;
        int running = reap_ranks(p, n, &failed);
        if (failed >= 0 && was_failed < 0) {
            fprintf(stderr, "ctune: rank %d (pid %d) %s\n", failed, (int)p[failed].pid,
                    describe_status(p[failed].status, what, sizeof what));
            deadline = ct_now() + grace_s;
        }
        if (running == 0) break;
        if (failed >= 0 && !user_signal && escalation < 2 && ct_now() >= deadline) {
            for (int k = 0; k < n; k++) {
                if (!p[k].running) continue;
                kill(p[k].pid, escalation == 0 ? SIGTERM : SIGKILL);
                if (escalation == 0)
                    fprintf(stderr, "ctune: stopped rank %d (pid %d) after rank %d failed\n", k, (int)p[k].pid, failed);
                else
                    fprintf(stderr, "ctune: killed rank %d (pid %d): still running %.1f s after SIGTERM\n",
                            k, (int)p[k].pid, grace_s);
            }
            escalation++;
            deadline = ct_now() + grace_s;
        }
        sleep_poll();
    }
    if (failed < 0) return CT_OK;
    int code = WIFEXITED(p[failed].status) ? WEXITSTATUS(p[failed].status) : 1;
    char log_note[600] = "";
    if (log_dir && failed >= 1)
        snprintf(log_note, sizeof log_note, "; its output is in %s/rank-%d.log", log_dir, failed);
    return ct_fail(err, code, "rank %d of %d %s%s", failed, n,
                   describe_status(p[failed].status, what, sizeof what), log_note);
}

/* Opens LOG_DIR/rank-K.log for appending, close-on-exec (the child's dup2 onto
 * stdout is what survives exec). */
static int open_rank_log(const char *log_dir, int rank, int *fd, ct_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.log", log_dir, rank);
    *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (*fd < 0) return CT_FAIL_RUNTIME(err, "%s: cannot open for writing (%s)", path, strerror(errno));
    return CT_OK;
}

int launch_ranks(const ct_launch_options *opt, ct_error *err)
{
    CT_ASSERT(opt->ranks >= 1 && opt->argv && opt->argv[0], "launch_ranks: %d ranks, no command", opt->ranks);
    int n = opt->ranks;
    const char *addr = opt->master_addr ? opt->master_addr : "127.0.0.1";
    double grace_s = opt->grace_s > 0 ? opt->grace_s : 0;
    int port = opt->master_port;
    int rc = check_visible_devices(n, err);
    if (!rc && port == 0) rc = pick_free_port(&port, err);
    if (!rc && opt->log_dir && n > 1) rc = ct_mkdirs(opt->log_dir, err);
    if (rc) return rc;

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    signals_seen[0] = signals_seen[1] = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    rank_proc *procs = ct_calloc((size_t)n, sizeof *procs);
    for (int k = 0; k < n && !rc; k++) {
        int log_fd = -1;
        if (opt->log_dir && k >= 1) rc = open_rank_log(opt->log_dir, k, &log_fd, err);
        if (rc) break;
        char **env = env_for_rank(k, n, addr, port);
        rc = spawn_rank(&procs[k], k, opt->argv, env, log_fd, err);
        env_free(env);
        if (log_fd >= 0) close(log_fd);
    }
    if (rc) stop_all(procs, n, grace_s);
    else rc = supervise(procs, n, grace_s, opt->log_dir, err);

    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    free(procs);
    return rc;
}
