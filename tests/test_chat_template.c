/* test_chat_template.c — the chat-template engine (src/text/chat_template.h) against
 * transformers' apply_chat_template: every template of tests/fixtures/chat_templates
 * x every conversation x add_generation_prompt, byte for byte (the expected
 * strings and errors were written by scripts/chat_template_fixtures.py with
 * transformers' renderer), then loading, the built-ins, and the errors and
 * limits one at a time. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "chat_template.h"
#include "check.h"
#include "json.h"

#define FIXTURES "tests/fixtures/chat_templates"

static json_doc *read_json(const char *path)
{
    size_t len;
    ct_error err;
    char *text = ct_read_file(path, &len, &err);
    if (!text) return NULL;
    json_doc *d = json_parse(text, len, path, &err);
    free(text);
    return d;
}

/* The fixed clock of scripts/chat_template_fixtures.py (DATE). */
static struct tm fixture_date(void)
{
    struct tm tm = {.tm_year = 2025 - 1900, .tm_mon = 2, .tm_mday = 9, .tm_hour = 14, .tm_min = 5, .tm_sec = 7};
    tm.tm_wday = 0;    /* a Sunday */
    tm.tm_yday = 67;   /* day 68 of the year */
    return tm;
}

static ct_chat_template *parse_text(const char *text, ct_error *err)
{
    ct_chat_template *t = chat_template_parse(text, strlen(text), "test.jinja", "<s>", "</s>", err);
    if (t) {
        struct tm date = fixture_date();
        chat_template_set_date(t, &date);
    }
    return t;
}

static ct_chat_template *load_fixture(const char *name, const json_value *expected, ct_error *err)
{
    char path[512];
    snprintf(path, sizeof path, FIXTURES "/%s.jinja", name);
    size_t len;
    char *text = ct_read_file(path, &len, err);
    if (!text) return NULL;
    const json_value *tokens = json_get(json_get(expected, "templates"), name);
    const json_value *bos = json_get_type(tokens, "bos_token", JSON_STRING), *eos = json_get_type(tokens, "eos_token", JSON_STRING);
    ct_chat_template *t = chat_template_parse(text, len, path, bos ? bos->string : NULL, eos ? eos->string : NULL, err);
    free(text);
    if (t) {
        struct tm date = fixture_date();
        chat_template_set_date(t, &date);
    }
    return t;
}

/* A conversation of conversations.json as messages (pointers into the document). */
static ct_chat_message *conversation(const json_value *convs, const char *name, int *n)
{
    for (size_t i = 0; i < convs->count; i++) {
        if (strcmp(json_get(convs->items[i], "name")->string, name) != 0) continue;
        const json_value *m = json_get(convs->items[i], "messages");
        ct_chat_message *msgs = ct_calloc(m->count + 1, sizeof *msgs);
        for (size_t k = 0; k < m->count; k++) {
            msgs[k].role = json_get(m->items[k], "role")->string;
            msgs[k].content = json_get(m->items[k], "content")->string;
        }
        *n = (int)m->count;
        return msgs;
    }
    return NULL;
}

/* Where two renders first differ, with the bytes around it, for a failure message. */
static void show_difference(const char *got, size_t got_len, const char *want, size_t want_len)
{
    size_t i = 0;
    while (i < got_len && i < want_len && got[i] == want[i]) i++;
    size_t from = i > 20 ? i - 20 : 0;
    printf("     first difference at byte %zu (got %zu bytes, want %zu)\n     got : ", i, got_len, want_len);
    for (size_t k = from; k < got_len && k < i + 40; k++) printf(got[k] == '\n' ? "\\n" : "%c", got[k]);
    printf("\n     want: ");
    for (size_t k = from; k < want_len && k < i + 40; k++) printf(want[k] == '\n' ? "\\n" : "%c", want[k]);
    printf("\n");
}

TEST(every_fixture_case_renders_as_transformers_does)
{
    json_doc *ed = read_json(FIXTURES "/expected.json"), *cd = read_json(FIXTURES "/conversations.json");
    REQUIRE(ed && cd, "cannot read the fixtures (run from the repo root)");
    const json_value *expected = json_root(ed), *cases = json_get(expected, "cases");
    int matched = 0, errors = 0, generation_cases = 0, total = (int)cases->count;
    char loaded_name[64] = "";
    ct_chat_template *t = NULL;
    for (size_t i = 0; i < cases->count; i++) {
        const json_value *cs = cases->items[i];
        const char *name = json_get(cs, "template")->string, *conv = json_get(cs, "conversation")->string;
        bool agp = json_get(cs, "add_generation_prompt")->boolean;
        ct_error err;
        if (strcmp(loaded_name, name) != 0) {
            chat_template_free(t);
            t = load_fixture(name, expected, &err);
            snprintf(loaded_name, sizeof loaded_name, "%s", name);
            CHECK(t, "%s: %s", name, err.msg);
        }
        if (!t) continue;
        int n;
        ct_chat_message *msgs = conversation(json_root(cd), conv, &n);
        REQUIRE(msgs, "no conversation %s", conv);
        char *out;
        size_t len;
        ct_chat_span *spans = NULL;
        size_t n_spans = 0;
        int rc = chat_template_render_spans(t, msgs, n, agp, &out, &len, &spans, &n_spans, &err);
        const json_value *text = json_get_type(cs, "text", JSON_STRING);
        if (text) {
            bool same = rc == CT_OK && len == text->string_len && memcmp(out, text->string, len) == 0;
            CHECK(same, "%s x %s (add_generation_prompt %d): %s", name, conv, agp, rc == CT_OK ? "differs" : err.msg);
            if (rc == CT_OK && !same) show_difference(out, len, text->string, text->string_len);
            const json_value *want = json_get_type(cs, "spans", JSON_ARRAY);
            bool same_spans = rc == CT_OK && (want ? want->count : 0) == n_spans;
            for (size_t k = 0; same_spans && k < n_spans; k++)
                same_spans = spans[k].start == (size_t)want->items[k]->items[0]->number &&
                             spans[k].end == (size_t)want->items[k]->items[1]->number;
            CHECK(same_spans, "%s x %s (add_generation_prompt %d): %zu generation spans, transformers %zu", name, conv,
                  agp, n_spans, want ? want->count : 0);
            generation_cases += want != NULL;
            matched += same && same_spans;
        } else {
            const char *want = json_get(cs, "error")->string, *type = json_get(cs, "error_type")->string;
            bool raised = strcmp(type, "TemplateError") == 0;   /* raise_exception(): its message must be ours */
            bool same = rc == CT_ERR_INPUT && (!raised || strstr(err.msg, want));
            CHECK(same, "%s x %s (add_generation_prompt %d): transformers raised %s: %s; we %s: %s", name, conv, agp, type,
                  want, rc == CT_OK ? "rendered" : "failed", rc == CT_OK ? out : err.msg);
            matched += same;
            errors++;
        }
        if (rc == CT_OK) free(out);
        free(spans);
        free(msgs);
    }
    chat_template_free(t);
    printf("     %d of %d cases as transformers renders them (%d of them errors, %d with generation spans)\n", matched,
           total, errors, generation_cases);
    CHECK(total > 500, "only %d cases", total);
    CHECK(generation_cases > 50, "only %d cases with generation spans", generation_cases);
    json_free(ed);
    json_free(cd);
}

/* Each built-in against the model template it reproduces: the same text where
 * the model's template renders, an error where it raises. */
TEST(builtin_templates_render_as_the_models_templates)
{
    static const char *pairs[][2] = {{"chatml", "chatml"}, {"llama2", "llama2"}, {"llama3", "llama3"},
                                     {"mistral", "mistral_v3"}, {"qwen3", "qwen3"}};
    json_doc *ed = read_json(FIXTURES "/expected.json"), *cd = read_json(FIXTURES "/conversations.json");
    REQUIRE(ed && cd, "cannot read the fixtures");
    const json_value *cases = json_get(json_root(ed), "cases");
    int compared = 0;
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
        ct_error err;
        ct_chat_template *t = chat_template_load(NULL, pairs[p][0], &err);
        REQUIRE(t, "%s", err.msg);
        CHECK(strcmp(chat_template_name(t), pairs[p][0]) == 0, "name %s", chat_template_name(t));
        for (size_t i = 0; i < cases->count; i++) {
            const json_value *cs = cases->items[i];
            if (strcmp(json_get(cs, "template")->string, pairs[p][1]) != 0) continue;
            const json_value *text = json_get_type(cs, "text", JSON_STRING), *type = json_get(cs, "error_type");
            if (!text && strcmp(type->string, "TemplateError") != 0) continue;   /* the model's template fails on no messages */
            int n;
            ct_chat_message *msgs = conversation(json_root(cd), json_get(cs, "conversation")->string, &n);
            char *out;
            size_t len;
            int rc = chat_template_render(t, msgs, n, json_get(cs, "add_generation_prompt")->boolean, &out, &len, &err);
            if (text) {
                bool same = rc == CT_OK && len == text->string_len && memcmp(out, text->string, len) == 0;
                CHECK(same, "built-in %s x %s: %s", pairs[p][0], json_get(cs, "conversation")->string, rc ? err.msg : "differs");
                if (rc == CT_OK && !same) show_difference(out, len, text->string, text->string_len);
            } else {
                CHECK(rc == CT_ERR_INPUT && strstr(err.msg, "raised by the template"), "built-in %s x %s: rendered, %s raised",
                      pairs[p][0], json_get(cs, "conversation")->string, pairs[p][1]);
            }
            if (rc == CT_OK) free(out);
            free(msgs);
            compared++;
        }
        chat_template_free(t);
    }
    CHECK(compared > 100, "only %d cases compared", compared);
    json_free(ed);
    json_free(cd);
}

// ---- loading ----

static char *temp_dir(void)
{
    char *d = ct_strdup("/tmp/ctune-chat-XXXXXX");
    CT_ASSERT(mkdtemp(d), "mkdtemp");
    return d;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CT_ASSERT(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static char *render_text(const ct_chat_template *t, bool agp, ct_error *err)
{
    ct_chat_message m[] = {{"user", "hi"}};
    char *out;
    size_t len;
    return chat_template_render(t, m, 1, agp, &out, &len, err) == CT_OK ? out : NULL;
}

TEST(model_folder_prefers_chat_template_jinja_and_reads_the_special_tokens)
{
    char *dir = temp_dir();
    write_file(dir, "tokenizer_config.json",
               "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<B>\"}, \"eos_token\": \"<E>\","
               " \"chat_template\": \"config\"}");
    ct_error err;
    ct_chat_template *t = chat_template_load(dir, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    char *out = render_text(t, false, &err);
    CHECK(out && strcmp(out, "config") == 0, "got %s", out ? out : err.msg);
    CHECK(strcmp(chat_template_name(t), "model") == 0, "name %s", chat_template_name(t));
    free(out);
    chat_template_free(t);
    write_file(dir, "chat_template.jinja", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\n");
    t = chat_template_load(dir, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    out = render_text(t, false, &err);
    CHECK(out && strcmp(out, "<B>hi<E>") == 0, "got %s", out ? out : err.msg);
    free(out);
    chat_template_free(t);
    ct_remove_tree(dir);
    free(dir);
}

TEST(a_list_of_templates_gives_the_default_one)
{
    char *dir = temp_dir();
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tools\"},"
               " {\"name\": \"default\", \"template\": \"plain\"}]}");
    ct_error err;
    ct_chat_template *t = chat_template_load(dir, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    char *out = render_text(t, false, &err);
    CHECK(out && strcmp(out, "plain") == 0, "got %s", out ? out : err.msg);
    free(out);
    chat_template_free(t);
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tools\"}]}");
    CHECK(!chat_template_load(dir, NULL, &err) && err.code == CT_ERR_INPUT && strstr(err.msg, "'default'") &&
              strstr(err.msg, "'tool_use'"), "%s", err.msg);
    /* a name holding a line break is quoted on the message's one line (a fuzz finding) */
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"a\\nb\", \"template\": \"x\"}]}");
    CHECK(!chat_template_load(dir, NULL, &err) && err.code == CT_ERR_INPUT && strstr(err.msg, "'a?b'") &&
              !strchr(err.msg, '\n'), "%s", err.msg);
    ct_remove_tree(dir);
    free(dir);
}

TEST(a_model_without_a_template_is_an_input_error_with_a_hint)
{
    char *dir = temp_dir();
    write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    ct_error err;
    CHECK(!chat_template_load(dir, NULL, &err) && err.code == CT_ERR_INPUT && strstr(err.msg, dir) &&
              strstr(err.msg, "HINT") && strstr(err.msg, "--chat-template"), "%s", err.msg);
    ct_chat_template *t = chat_template_load(dir, "chatml", &err);   /* an override needs no template there */
    CHECK(t, "%s", err.msg);
    chat_template_free(t);
    ct_remove_tree(dir);
    free(dir);
}

TEST(override_takes_a_builtin_name_or_a_jinja_file)
{
    char *dir = temp_dir();
    write_file(dir, "mine.jinja", "{% for m in messages %}[{{ m.role }}]{% endfor %}");
    char path[512];
    snprintf(path, sizeof path, "%s/mine.jinja", dir);
    ct_error err;
    ct_chat_template *t = chat_template_load(NULL, path, &err);
    REQUIRE(t, "%s", err.msg);
    char *out = render_text(t, false, &err);
    CHECK(out && strcmp(out, "[user]") == 0, "got %s", out ? out : err.msg);
    CHECK(strcmp(chat_template_name(t), path) == 0, "name %s", chat_template_name(t));
    free(out);
    chat_template_free(t);
    for (int i = 0; chat_template_builtin_names[i]; i++) {
        t = chat_template_load(NULL, chat_template_builtin_names[i], &err);
        CHECK(t, "%s: %s", chat_template_builtin_names[i], err.msg);
        chat_template_free(t);
    }
    CHECK(!chat_template_load(NULL, "no-such-template", &err) && err.code == CT_ERR_INPUT && strstr(err.msg, "chatml"),
          "%s", err.msg);
    ct_remove_tree(dir);
    free(dir);
}

// ---- errors ----

/* The template fails (to parse or to render on one user message) with an input error of one line holding want. */
static void check_fails(const char *text, const char *want, const char *want2)
{
    ct_error err = {0};
    ct_chat_template *t = parse_text(text, &err);
    char *out = t ? render_text(t, true, &err) : NULL;
    CHECK(!out && err.code == CT_ERR_INPUT && strstr(err.msg, want) && (!want2 || strstr(err.msg, want2)) &&
              !strchr(err.msg, '\n'), "%s -> %s", text, out ? out : err.msg);
    free(out);
    chat_template_free(t);
}

TEST(syntax_errors_name_the_line_and_column)
{
    check_fails("line one\n{{ 1 +* 2 }}", "test.jinja: line 2:7:", "unexpected '*'");
    check_fails("{% if true %}\n  never closed", "line 2:15:",
                "expected {% elif %} or {% else %} or {% endif %} (the 'if' at line 1:4");
    check_fails("{{ 'unterminated }}", "line 1:4: unterminated string", NULL);
    check_fails("{{ x. }}", "line 1:7", "expected a name or number");
    check_fails("{% for x in %}{% endfor %}", "line 1:13", "expected an expression");
    check_fails("{% endif %}", "line 1:4", "unexpected {% endif %}");
    check_fails("{# never closed", "line 1:1", "missing end of comment tag");
    check_fails("{{ [1, 2) }}", "unexpected ')', expected ']'", NULL);
    check_fails("{{ 99999999999999999999 }}", "integer literal too large", NULL);
    check_fails("{% break %}", "'break' outside a for loop", NULL);
}

TEST(unsupported_constructs_are_named)
{
    check_fails("{% include 'other.jinja' %}", "line 1:4", "the {% include %} tag is not supported");
    check_fails("a\n{{ messages | wordwrap }}", "line 2:15", "filter 'wordwrap' is not supported");
    check_fails("{{ 1 is prime }}", "test 'prime' is not supported", NULL);
    check_fails("{% frobnicate %}", "unknown tag 'frobnicate'", NULL);
    check_fails("{% for m in messages recursive %}{% endfor %}", "recursive for loops are not supported", NULL);
    check_fails("{{ f(*args) }}", "*args and **kwargs in a call are not supported", NULL);
    check_fails("{{ '%s' % 1 }}", "printf-style string formatting", NULL);
    check_fails("{{ 'x'.format(1) }}", "str.format() is not supported", NULL);
    check_fails("{{ messages.append(1) }}", "access to attribute 'append' of 'list' object is unsafe", NULL);
}

TEST(raise_exception_gives_its_message_and_where)
{
    check_fails("\n  {{ raise_exception('roles must alternate') }}", "line 2:6: raised by the template: roles must alternate",
                NULL);
}

TEST(runtime_errors_are_input_errors_like_jinja2s)
{
    check_fails("{{ messages[3]['role'] }}", "list object has no element 3", NULL);
    check_fails("{{ nothing.attr }}", "'nothing' is undefined", NULL);
    check_fails("{{ messages[0].missing.deeper }}", "'dict object' has no attribute 'missing'", NULL);
    check_fails("{{ 'a' + 1 }}", "can only concatenate str (not \"int\") to str", NULL);
    check_fails("{{ 1 / 0 }}", "division by zero", NULL);
    check_fails("{{ 2 ** 64 }}", "integer overflow", NULL);
    check_fails("{{ undefined_thing | tojson }}", "is not JSON serializable", NULL);
    check_fails("{{ 1 < 'a' }}", "'<' not supported between instances of 'int' and 'str'", NULL);
    check_fails("{{ range(1000000) }}", "Range too big", NULL);
    check_fails("{% set x = 1 %}{% set x.y = 2 %}", "cannot assign attribute on non-namespace object", NULL);
    check_fails("{% for a, b in [1] %}{% endfor %}", "'int' object is not iterable", NULL);
}

TEST(recursion_and_nesting_are_capped)
{
    check_fails("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper than", NULL);
    char deep[8192];
    strcpy(deep, "{{ ");
    for (int i = 0; i < 2000; i++) strcat(deep, "(");
    check_fails(deep, "deeper than", NULL);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 1000; i++) strcat(deep, "-");
    strcat(deep, "1 }}");
    check_fails(deep, "nested deeper than", NULL);
    strcpy(deep, "");
    for (int i = 0; i < 300; i++) strcat(deep, "{% if true %}");
    check_fails(deep, "nested deeper than", NULL);
}

TEST(output_steps_and_memory_are_capped)
{
    ct_error err;
    ct_chat_template *t = parse_text("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", &err);
    REQUIRE(t, "%s", err.msg);
    ct_chat_limits lim = chat_template_default_limits();
    lim.max_output = 1 << 20;
    chat_template_set_limits(t, &lim);
    char *out = render_text(t, false, &err);
    CHECK(!out && strstr(err.msg, "output larger than the 1048576-byte limit"), "%s", out ? "rendered" : err.msg);
    free(out);
    chat_template_free(t);
    check_fails("{{ 'x' * 1000000000000 }}", "larger than the", "output limit");
    /* an empty string or list repeated a huge number of times is empty, at once
     * (a fuzz finding: the copy loop ran n times over zero bytes) */
    t = parse_text("[{{ '' * 1000000000000 }}|{{ ([] * 1000000000000) | length }}]", &err);
    REQUIRE(t, "%s", err.msg);
    out = render_text(t, false, &err);
    CHECK(out && !strcmp(out, "[|0]"), "%s", out ? out : err.msg);
    free(out);
    chat_template_free(t);
    /* iterating an empty generator or dict (a fuzz finding: NULL + 0 under UBSan) */
    t = parse_text("[{% for x in [] | select %}{{ x }}{% endfor %}{% for k in {} %}{{ k }}{% endfor %}"
                   "{% for p in nothing | items %}{% endfor %}{{ [] | map('upper') | list }}|{{ {} | list }}]", &err);
    REQUIRE(t, "%s", err.msg);
    out = render_text(t, false, &err);
    CHECK(out && !strcmp(out, "[[]|[]]"), "%s", out ? out : err.msg);
    free(out);
    chat_template_free(t);
    check_fails("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", "more than 20000000 steps",
                NULL);
    t = parse_text("{% set ns = namespace(l=[]) %}{% for i in range(30000) %}{% set ns.l = ns.l + [i] %}{% endfor %}", &err);
    REQUIRE(t, "%s", err.msg);
    lim = chat_template_default_limits();
    lim.max_memory = 16 << 20;
    chat_template_set_limits(t, &lim);
    out = render_text(t, false, &err);
    CHECK(!out && strstr(err.msg, "memory limit"), "%s", out ? "rendered" : err.msg);
    free(out);
    chat_template_free(t);
}

TEST(templates_that_are_not_utf8_or_too_large_are_refused)
{
    check_fails("ok\n{{ 'caf\xe9' }}", "line 2:8: not UTF-8 (byte 0xe9)", NULL);
    size_t n = CT_CHAT_TEMPLATE_MAX_BYTES + 1;
    char *big = ct_malloc(n);
    memset(big, 'x', n);
    ct_error err;
    CHECK(!chat_template_parse(big, n, "big.jinja", NULL, NULL, &err) && strstr(err.msg, "limit"), "%s", err.msg);
    free(big);
}

// ---- behaviours ----

TEST(a_message_without_content_is_none)
{
    ct_error err;
    ct_chat_template *t = parse_text("{{ messages[0].content is none }}|{{ messages[0].content }}", &err);
    REQUIRE(t, "%s", err.msg);
    ct_chat_message m[] = {{"assistant", NULL}};
    char *out;
    size_t len;
    REQUIRE(chat_template_render(t, m, 1, false, &out, &len, &err) == CT_OK, "%s", err.msg);
    CHECK(strcmp(out, "True|None") == 0, "got %s", out);
    free(out);
    m[0].role = NULL;
    CHECK(chat_template_render(t, m, 1, false, &out, &len, &err) == CT_ERR_INPUT && strstr(err.msg, "no role"), "%s", err.msg);
    chat_template_free(t);
}

TEST(strftime_now_reads_the_clock_unless_a_date_is_set)
{
    ct_error err;
    ct_chat_template *t = chat_template_parse("{{ strftime_now('%Y') }}", 24, "clock", NULL, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    char *out = render_text(t, false, &err);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char year[8];
    strftime(year, sizeof year, "%Y", &tm);
    CHECK(out && strcmp(out, year) == 0, "got %s, the clock says %s", out ? out : err.msg, year);
    free(out);
    struct tm date = fixture_date();
    chat_template_set_date(t, &date);
    out = render_text(t, false, &err);
    CHECK(out && strcmp(out, "2025") == 0, "got %s", out ? out : err.msg);
    free(out);
    chat_template_free(t);
}

typedef struct render_job { const ct_chat_template *t; const char *want; int ok; } render_job;

static void *render_many(void *arg)
{
    render_job *job = arg;
    ct_chat_message m[] = {{"system", "s"}, {"user", "hi"}, {"assistant", "<think>\nx\n</think>\n\ny"}};
    for (int i = 0; i < 200; i++) {
        char *out;
        size_t len;
        ct_error err;
        if (chat_template_render(job->t, m, 3, true, &out, &len, &err) != CT_OK) return NULL;
        job->ok += strcmp(out, job->want) == 0;
        free(out);
    }
    return NULL;
}

TEST(one_template_renders_on_many_threads_at_once)
{
    ct_error err;
    ct_chat_template *t = chat_template_load(NULL, "qwen3", &err);
    REQUIRE(t, "%s", err.msg);
    ct_chat_message m[] = {{"system", "s"}, {"user", "hi"}, {"assistant", "<think>\nx\n</think>\n\ny"}};
    char *want;
    size_t len;
    REQUIRE(chat_template_render(t, m, 3, true, &want, &len, &err) == CT_OK, "%s", err.msg);
    pthread_t th[4];
    render_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (render_job){t, want, 0};
        pthread_create(&th[i], NULL, render_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok == 200, "thread %d: %d of 200 renders equal", i, jobs[i].ok);
    }
    free(want);
    chat_template_free(t);
}

int main(void)
{
    RUN(every_fixture_case_renders_as_transformers_does);
    RUN(builtin_templates_render_as_the_models_templates);
    RUN(model_folder_prefers_chat_template_jinja_and_reads_the_special_tokens);
    RUN(a_list_of_templates_gives_the_default_one);
    RUN(a_model_without_a_template_is_an_input_error_with_a_hint);
    RUN(override_takes_a_builtin_name_or_a_jinja_file);
    RUN(syntax_errors_name_the_line_and_column);
    RUN(unsupported_constructs_are_named);
    RUN(raise_exception_gives_its_message_and_where);
    RUN(runtime_errors_are_input_errors_like_jinja2s);
    RUN(recursion_and_nesting_are_capped);
    RUN(output_steps_and_memory_are_capped);
    RUN(templates_that_are_not_utf8_or_too_large_are_refused);
    RUN(a_message_without_content_is_none);
    RUN(strftime_now_reads_the_clock_unless_a_date_is_set);
    RUN(one_template_renders_on_many_threads_at_once);
    return check_summary();
}
