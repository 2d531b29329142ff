/* cli.c — see cli.h. One pass over argv: options are looked up in the
 * command's table, positional arguments are compacted to the front of argv
 * (a slot is only rewritten after it was read, so stored values stay valid). */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CLI_MAX_OPTS 32

static void print_help(const cli_cmd *c)
{
    printf("usage: ctune %s\n\noptions:\n", c->usage);
    for (const cli_opt *o = c->opts; o->name; o++) {
        char left[80];
        snprintf(left, sizeof left, "%s%s%s%s", o->name, o->value ? " " : "", o->value ? o->value : "",
                 o->many ? "..." : "");
        printf("  %-30s %s%s\n", left, o->help, o->required ? " (required)" : "");
    }
    printf("  %-30s %s\n", "-h, --help", "print this help and exit");
}

static const cli_opt *find_opt(const cli_cmd *c, const char *arg, size_t len)
{
    for (const cli_opt *o = c->opts; o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, arg, len)) return o;
    return NULL;
}

static int store(const cli_opt *o, const char *value, ct_error *err)
{
    if (o->call) return o->call(o->ctx, value, err);
    *o->str = value;
    return CT_OK;
}

int cli_parse(const cli_cmd *c, int argc, char **argv, int *n_args, ct_error *err)
{
    const char *cmd = c->name;
    bool seen[CLI_MAX_OPTS] = {0};
    int n = 0;
    bool only_args = false;
    for (const cli_opt *o = c->opts; o->name; o++)
        CT_ASSERT(o - c->opts < CLI_MAX_OPTS && !!o->str + !!o->flag + !!o->call == 1 && !o->value == !!o->flag,
                  "cli: option %s of %s is malformed", o->name, cmd);
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (only_args || a[0] != '-' || a[1] == 0) { /* "-" alone is a file name (stdin) */
            if (!n_args) return CT_FAIL_INPUT(err, "usage: unexpected argument '%s' (see ctune %s --help)", a, cmd);
            argv[++n] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_args = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_help(c);
            return CLI_HELP;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *o = find_opt(c, a, len);
        if (!o) return CT_FAIL_INPUT(err, "usage: unknown option '%.*s' (see ctune %s --help)", (int)len, a, cmd);
        seen[o - c->opts] = true;
        if (!o->value) {
            if (eq) return CT_FAIL_INPUT(err, "usage: %s takes no value (see ctune %s --help)", o->name, cmd);
            *o->flag = true;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return CT_FAIL_INPUT(err, "usage: %s needs a value (see ctune %s --help)", o->name, cmd);
        int rc = store(o, v, err);
        while (rc == CT_OK && o->many && i + 1 < argc && argv[i + 1][0] != '-') rc = store(o, argv[++i], err);
        if (rc) return rc;
    }
    for (const cli_opt *o = c->opts; o->name; o++)
        if (o->required && !seen[o - c->opts])
            return CT_FAIL_INPUT(err, "usage: %s is required (see ctune %s --help)", o->name, cmd);
    if (n_args) *n_args = n;
    return CT_OK;
}

int cli_parse_ll(const char *opt, const char *s, long long lo, long long hi, long long *out, ct_error *err)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return CT_FAIL_INPUT(err, "%s '%s': expected an integer in %lld..%lld", opt, s, lo, hi);
    *out = v;
    return CT_OK;
}

int cli_check_file(const char *path, ct_error *err)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT) return CT_FAIL_INPUT(err, "%s: cannot be read (%s)", path, strerror(errno));
        if (lstat(path, &st) == 0) return CT_FAIL_INPUT(err, "%s: a broken symbolic link", path);
        return CT_OK;
    }
    if (S_ISREG(st.st_mode)) return CT_OK;
    const char *what = S_ISDIR(st.st_mode) ? "a folder" : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket" : "a device";
    return CT_FAIL_INPUT(err, "%s: %s, not a regular file", path, what);
}

static int check_files_in(const char *dir, const char *const *names, ct_error *err)
{
    char path[4096];
    int rc = CT_OK;
    for (; *names && !rc; names++) {
        snprintf(path, sizeof path, "%s/%s", dir, *names);
        rc = cli_check_file(path, err);
    }
    return rc;
}

int cli_check_model_dir(const char *dir, ct_error *err)
{
    static const char *const names[] = {"config.json", "generation_config.json", "model.safetensors",
                                        "model.safetensors.index.json", NULL};
    return check_files_in(dir, names, err);
}

int cli_check_adapter_dir(const char *dir, ct_error *err)
{
    static const char *const names[] = {"adapter_config.json", "adapter_model.safetensors", NULL};
    return check_files_in(dir, names, err);
}

int cli_check_new_dir(const char *out, const char *cmd, ct_error *err)
{
    struct stat st;
    if (stat(out, &st) != 0) return CT_OK;
    if (!S_ISDIR(st.st_mode)) return CT_FAIL_INPUT(err, "%s: exists and is not a folder (%s writes a new folder)", out, cmd);
    DIR *d = opendir(out);
    if (!d) return CT_FAIL_INPUT(err, "%s: cannot list the folder", out);
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    if (!empty) return CT_FAIL_INPUT(err, "%s: exists and is not empty (%s writes a new folder)", out, cmd);
    return CT_OK;
}
