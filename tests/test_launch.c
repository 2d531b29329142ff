/* test_launch.c — the `--gpus N` supervisor (src/dist/launch.h). Every rank is
 * /bin/sh -c SCRIPT, so no ctune binary is needed; scripts leave what they saw
 * in files under $T, a fresh folder per test. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "launch.h"

static char root[] = "/tmp/ctune-test-launch-XXXXXX";
static char dir[512];  /* this test's folder, also $T for the scripts */

static void fresh_dir(const char *name)
{
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    mkdir(dir, 0755);
    setenv("T", dir, 1);
}

/* The text of $T/NAME, or NULL when it does not exist (caller frees). */
static char *read_text(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ct_error err = {0};
    return ct_read_file(path, NULL, &err);
}

static bool file_exists(const char *name)
{
    char *t = read_text(name);
    free(t);
    return t != NULL;
}

/* Waits up to 5 s for $T/NAME to appear. */
static bool wait_for_file(const char *name)
{
    for (int i = 0; i < 500; i++) {
        if (file_exists(name)) return true;
        usleep(10000);
    }
    return false;
}

/* Whether text holds line as a whole line. */
static bool has_line(const char *text, const char *line)
{
    size_t len = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && (p[len] == '\n' || p[len] == 0)) return true;
    return false;
}

/* The pid in "...PREFIX(pid P)..." of text, or -1. */
static pid_t pid_after(const char *text, const char *prefix)
{
    const char *p = text ? strstr(text, prefix) : NULL;
    int pid;
    return p && sscanf(p + strlen(prefix), " (pid %d)", &pid) == 1 ? pid : -1;
}

static bool process_gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

static int saved_stderr = -1;

/* Sends our stderr (and so the children's) to $T/stderr until stderr_end. */
static void stderr_begin(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/stderr", dir);
    fflush(stderr);
    saved_stderr = dup(STDERR_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDERR_FILENO);
    close(fd);
}

/* Puts stderr back and returns what was written to it (caller frees). */
static char *stderr_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    char *t = read_text("stderr");
    return t ? t : ct_strdup("");
}

static ct_launch_options sh_options(int ranks, const char *script, double grace_s)
{
    static char *argv[4] = {"/bin/sh", "-c", NULL, NULL};
    argv[2] = (char *)script;
    return (ct_launch_options){.ranks = ranks, .argv = argv, .grace_s = grace_s, .master_port = 29511};
}

static int run_sh(int ranks, const char *script, double grace_s, ct_error *err)
{
    ct_launch_options opt = sh_options(ranks, script, grace_s);
    return launch_ranks(&opt, err);
}

TEST(all_ranks_exiting_zero_returns_zero)
{
    fresh_dir("ok");
    ct_error err = {0};
    int rc = run_sh(3, "exit 0", 1.0, &err);
    CHECK(rc == 0 && err.code == CT_OK, "rc %d: %s", rc, err.msg);
}

TEST(every_rank_sees_the_launcher_environment)
{
    fresh_dir("env");
    ct_error err = {0};
    REQUIRE(run_sh(3, "env > \"$T/env-$RANK\"", 1.0, &err) == 0, "%s", err.msg);
    for (int k = 0; k < 3; k++) {
        char name[32], want[64];
        snprintf(name, sizeof name, "env-%d", k);
        char *env = read_text(name);
        REQUIRE(env, "rank %d wrote no environment", k);
        snprintf(want, sizeof want, "RANK=%d", k);
        CHECK(has_line(env, want), "rank %d: no %s", k, want);
        snprintf(want, sizeof want, "LOCAL_RANK=%d", k);
        CHECK(has_line(env, want), "rank %d: no %s", k, want);
        CHECK(has_line(env, "WORLD_SIZE=3") && has_line(env, "LOCAL_WORLD_SIZE=3"), "rank %d: world size", k);
        CHECK(has_line(env, "MASTER_ADDR=127.0.0.1") && has_line(env, "MASTER_PORT=29511"), "rank %d: master", k);
        free(env);
    }
}

TEST(failing_rank_status_is_returned_and_the_others_are_stopped)
{
    fresh_dir("fail");
    ct_error err = {0};
    stderr_begin();
    double t0 = ct_now();
    int rc = run_sh(3, "[ \"$RANK\" = 1 ] && exit 2; exec sleep 100", 0.2, &err);
    double took = ct_now() - t0;
    char *log = stderr_end();
    CHECK(rc == 2, "rc %d, want rank 1's exit status 2", rc);
    CHECK(took < 1.5, "took %.2f s for a 0.2 s grace", took);
    CHECK(strstr(err.msg, "rank 1 of 3 exited with status 2"), "summary: %s", err.msg);
    CHECK(strstr(log, "ctune: rank 1 (pid ") && strstr(log, ") exited with status 2\n"), "stderr: %s", log);
    for (int k = 0; k < 3; k += 2) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "ctune: stopped rank %d", k);
        pid_t pid = pid_after(log, prefix);
        CHECK(pid > 0 && strstr(log, "after rank 1 failed"), "no line for stopping rank %d: %s", k, log);
        CHECK(process_gone(pid), "rank %d (pid %d) still exists", k, (int)pid);
    }
    free(log);
}

TEST(rank_killed_by_a_signal_returns_one_and_names_it)
{
    fresh_dir("killed");
    ct_error err = {0};
    stderr_begin();
    int rc = run_sh(2, "[ \"$RANK\" = 0 ] && kill -KILL $$; exec sleep 100", 0.2, &err);
    char *log = stderr_end();
    CHECK(rc == 1, "rc %d", rc);
    CHECK(strstr(err.msg, "rank 0 of 2 was killed by signal SIGKILL"), "summary: %s", err.msg);
    CHECK(strstr(log, "ctune: rank 0 (pid ") && strstr(log, "was killed by signal SIGKILL"), "stderr: %s", log);
    free(log);
}

TEST(rank_ignoring_sigterm_is_killed_after_the_second_grace)
{
    fresh_dir("stubborn");
    ct_error err = {0};
    stderr_begin();
    double t0 = ct_now();
    int rc = run_sh(2, "if [ \"$RANK\" = 1 ]; then sleep 0.1; exit 3; fi; trap '' TERM; exec sleep 100", 0.2, &err);
    double took = ct_now() - t0;
    char *log = stderr_end();
    CHECK(rc == 3, "rc %d: %s", rc, err.msg);
    CHECK(took >= 0.1 + 2 * 0.2 && took < 2.0, "took %.2f s, want about 0.5", took);
    pid_t pid = pid_after(log, "ctune: stopped rank 0");
    CHECK(strstr(log, "ctune: killed rank 0"), "no SIGKILL line: %s", log);
    CHECK(process_gone(pid), "rank 0 (pid %d) still exists", (int)pid);
    free(log);
}

TEST(cuda_visible_devices_is_kept_and_local_rank_picks_the_gpu)
{
    fresh_dir("devices");
    setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
    ct_error err = {0};
    int rc = run_sh(2, "echo \"$CUDA_VISIBLE_DEVICES $LOCAL_RANK\" > \"$T/dev-$RANK\"", 1.0, &err);
    unsetenv("CUDA_VISIBLE_DEVICES");
    REQUIRE(rc == 0, "rc %d: %s", rc, err.msg);
    char *d0 = read_text("dev-0"), *d1 = read_text("dev-1");
    CHECK(d0 && strcmp(d0, "3,5 0\n") == 0, "rank 0 saw '%s'", d0 ? d0 : "(nothing)");
    CHECK(d1 && strcmp(d1, "3,5 1\n") == 0, "rank 1 saw '%s'", d1 ? d1 : "(nothing)");
    free(d0);
    free(d1);
}

TEST(too_few_visible_devices_fails_before_any_rank_starts)
{
    fresh_dir("few_devices");
    setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
    ct_error err = {0};
    int rc = run_sh(3, "touch \"$T/started-$RANK\"", 1.0, &err);
    unsetenv("CUDA_VISIBLE_DEVICES");
    CHECK(rc == CT_ERR_INPUT && err.code == CT_ERR_INPUT, "rc %d", rc);
    CHECK(strcmp(err.msg, "--gpus 3: CUDA_VISIBLE_DEVICES lists 2 GPUs (3,5)") == 0, "message: %s", err.msg);
    CHECK(!file_exists("started-0"), "rank 0 was started");
}

TEST(unset_cuda_visible_devices_stays_unset)
{
    fresh_dir("no_devices");
    ct_error err = {0};
    REQUIRE(run_sh(2, "echo \"${CUDA_VISIBLE_DEVICES-unset}\" > \"$T/dev-$RANK\"", 1.0, &err) == 0, "%s", err.msg);
    char *d1 = read_text("dev-1");
    CHECK(d1 && strcmp(d1, "unset\n") == 0, "rank 1 saw '%s'", d1 ? d1 : "(nothing)");
    free(d1);
}

TEST(log_dir_gets_the_stdout_of_ranks_above_zero_appended)
{
    fresh_dir("logs");
    char logs[600];
    snprintf(logs, sizeof logs, "%s/logs/run", dir);
    ct_launch_options opt = sh_options(3, "[ \"$RANK\" = 0 ] || { echo out-$RANK; echo err-$RANK >&2; }", 1.0);
    opt.log_dir = logs;
    ct_error err = {0};
    stderr_begin();
    int rc1 = launch_ranks(&opt, &err), rc2 = launch_ranks(&opt, &err);
    char *log = stderr_end();
    REQUIRE(rc1 == 0 && rc2 == 0, "rc %d %d: %s", rc1, rc2, err.msg);
    char *r1 = read_text("logs/run/rank-1.log"), *r2 = read_text("logs/run/rank-2.log");
    CHECK(r1 && strcmp(r1, "out-1\nout-1\n") == 0, "rank-1.log: '%s'", r1 ? r1 : "(missing)");
    CHECK(r2 && strcmp(r2, "out-2\nout-2\n") == 0, "rank-2.log: '%s'", r2 ? r2 : "(missing)");
    CHECK(!file_exists("logs/run/rank-0.log"), "rank 0 got a log file");
    CHECK(strstr(log, "err-1\n"), "rank 1's stderr did not reach ours: '%s'", log);
    free(r1);
    free(r2);
    free(log);
}

TEST(master_port_zero_picks_a_free_port)
{
    fresh_dir("port");
    ct_launch_options opt = sh_options(2, "echo \"$MASTER_PORT\" > \"$T/port-$RANK\"", 1.0);
    opt.master_port = 0;
    ct_error err = {0};
    REQUIRE(launch_ranks(&opt, &err) == 0, "%s", err.msg);
    char *p0 = read_text("port-0"), *p1 = read_text("port-1");
    REQUIRE(p0 && p1, "a rank wrote no port");
    int port = atoi(p0);
    CHECK(port > 0 && port < 65536, "port %d", port);
    CHECK(strcmp(p0, p1) == 0, "ranks disagree: %s vs %s", p0, p1);
    free(p0);
    free(p1);
}

TEST(missing_command_is_the_supervisors_own_error)
{
    fresh_dir("missing");
    char *argv[] = {"/nonexistent/ctune", NULL};
    ct_launch_options opt = {.ranks = 2, .argv = argv, .grace_s = 0.2, .master_port = 29511};
    ct_error err = {0};
    int rc = launch_ranks(&opt, &err);
    CHECK(rc == CT_ERR_RUNTIME, "rc %d", rc);
    CHECK(strstr(err.msg, "rank 0: cannot run /nonexistent/ctune"), "message: %s", err.msg);
}

/* Runs launch_ranks in a child of ours (it is then the supervisor we can
 * signal), with its stderr in $T/stderr; returns its pid. */
static pid_t fork_supervisor(int ranks, const char *script, double grace_s)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s/stderr", dir);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, STDERR_FILENO);
        ct_launch_options opt = sh_options(ranks, script, grace_s);
        ct_error err = {0};
        _exit(launch_ranks(&opt, &err));
    }
    return pid;
}

TEST(sigterm_is_forwarded_and_ranks_may_take_longer_than_grace_to_save)
{
    fresh_dir("forward");
    /* Rank 1 "saves" for 0.5 s, well past the 0.1 s grace: the supervisor must
     * not stop it, though rank 0 has already exited 143. */
    pid_t sup = fork_supervisor(2,
        "trap 'kill $s; echo > \"$T/term-$RANK\"; [ \"$RANK\" = 1 ] && sleep 0.5; "
        "echo > \"$T/done-$RANK\"; exit 143' TERM; "
        "sleep 100 & s=$!; touch \"$T/ready-$RANK\"; wait $s", 0.1);
    REQUIRE(sup > 0, "fork failed");
    bool ready = wait_for_file("ready-0") && wait_for_file("ready-1");
    kill(sup, ready ? SIGTERM : SIGKILL);
    int status = 0;
    waitpid(sup, &status, 0);
    REQUIRE(ready, "the ranks never started");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 143, "supervisor status 0x%x, want exit 143", status);
    CHECK(file_exists("term-0") && file_exists("term-1"), "a rank did not get SIGTERM");
    CHECK(file_exists("done-1"), "rank 1 was stopped before it finished saving");
    char *log = read_text("stderr");
    CHECK(log && !strstr(log, "stopped rank"), "the supervisor stopped a rank: %s", log ? log : "");
    free(log);
}

TEST(ranks_get_sigterm_when_the_supervisor_is_killed)
{
    fresh_dir("orphans");
    pid_t sup = fork_supervisor(2,
        "trap 'kill $s; echo > \"$T/term-$RANK\"; exit 0' TERM; "
        "sleep 100 & s=$!; touch \"$T/ready-$RANK\"; wait $s", 0.1);
    REQUIRE(sup > 0, "fork failed");
    bool ready = wait_for_file("ready-0") && wait_for_file("ready-1");
    kill(sup, SIGKILL);
    waitpid(sup, NULL, 0);
    REQUIRE(ready, "the ranks never started");
    CHECK(wait_for_file("term-0") && wait_for_file("term-1"), "a rank outlived its supervisor without SIGTERM");
}

int main(void)
{
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    /* The machine's own GPU list would change what the ranks see. */
    unsetenv("CUDA_VISIBLE_DEVICES");
    RUN(all_ranks_exiting_zero_returns_zero);
    RUN(every_rank_sees_the_launcher_environment);
    RUN(failing_rank_status_is_returned_and_the_others_are_stopped);
    RUN(rank_killed_by_a_signal_returns_one_and_names_it);
    RUN(rank_ignoring_sigterm_is_killed_after_the_second_grace);
    RUN(cuda_visible_devices_is_kept_and_local_rank_picks_the_gpu);
    RUN(too_few_visible_devices_fails_before_any_rank_starts);
    RUN(unset_cuda_visible_devices_stays_unset);
    RUN(log_dir_gets_the_stdout_of_ranks_above_zero_appended);
    RUN(master_port_zero_picks_a_free_port);
    RUN(missing_command_is_the_supervisors_own_error);
    RUN(sigterm_is_forwarded_and_ranks_may_take_longer_than_grace_to_save);
    RUN(ranks_get_sigterm_when_the_supervisor_is_killed);
    ct_remove_tree(root);
    return check_summary();
}
