/* chat_template.c — where a chat template comes from (a model folder, a
 * built-in, a file), its parse, and a render's setup: the variables
 * transformers' apply_chat_template passes (messages, add_generation_prompt,
 * the special tokens of special_tokens_map, tools=None, documents=None).
 * The engine itself: chat_template_internal.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat_template_internal.h"
#include "json.h"

struct ct_chat_template {
    char *name;               /* chat_template_name */
    char *source;             /* what errors cite */
    char *text;               /* the source, newlines normalised (the tree points into it) */
    size_t len;
    jt_chunk *pool;           /* the syntax tree */
    jt_body body;
    char *bos, *eos;          /* NULL: undefined in the template */
    bool has_generation;      /* chat_template_has_generation */
    bool has_date;
    struct tm date;
    ct_chat_limits limits;
};

/* Python's \s in a str pattern: the characters str.isspace() accepts. */
static size_t skip_space(const char *s, size_t n, size_t i)
{
    while (i < n) {
        size_t j = i;
        if (!jt_is_space(jt_utf8_next(s, n, &j))) break;
        i = j;
    }
    return i;
}

/* prepare_data.py's (and transformers') test for the tag: \{%-?\s*generation\s*-?%\} found in s. */
static bool source_has_generation(const char *s, size_t n)
{
    static const char tag[] = "generation";
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t j = i + 2;
        if (j < n && s[j] == '-') j++;
        j = skip_space(s, n, j);
        if (n - j < sizeof tag - 1 || memcmp(s + j, tag, sizeof tag - 1)) continue;
        j = skip_space(s, n, j + sizeof tag - 1);
        if (j < n && s[j] == '-') j++;
        if (n - j >= 2 && s[j] == '%' && s[j + 1] == '}') return true;
    }
    return false;
}

// ---- built-ins ----

/* Each reproduces, for system/user/assistant conversations, what the model's
 * own template renders (tests/test_chat_template.c compares them with the
 * fixtures), with the special tokens written out so that no tokenizer_config
 * is needed. */
static const struct { const char *name, *text; } builtins[] = {
    {"chatml",   /* ChatML, as Qwen2-style and many fine-tunes use it */
     "{%- for message in messages %}\n"
     "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
     "{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n"
     "    {{- '<|im_start|>assistant\\n' }}\n"
     "{%- endif %}\n"},
    {"llama2",   /* Llama-2-chat: [INST] turns, the system prompt in <<SYS>> inside the first */
     "{%- if messages and messages[0]['role'] == 'system' %}\n"
     "    {%- set system_message = messages[0]['content'] %}\n"
     "    {%- set loop_messages = messages[1:] %}\n"
     "{%- else %}\n"
     "    {%- set loop_messages = messages %}\n"
     "{%- endif %}\n"
     "{%- for message in loop_messages %}\n"
     "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
     "        {{- raise_exception('llama2: after an optional system message, roles must alternate user/assistant/user/...') }}\n"
     "    {%- endif %}\n"
     "    {%- set content = message['content'] %}\n"
     "    {%- if loop.first and system_message is defined %}\n"
     "        {%- set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + content %}\n"
     "    {%- endif %}\n"
     "    {%- if message['role'] == 'user' %}\n"
     "        {{- '<s>[INST] ' + content.strip() + ' [/INST]' }}\n"
     "    {%- elif message['role'] == 'assistant' %}\n"
     "        {{- ' ' + content.strip() + ' </s>' }}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"},
    {"llama3",   /* Llama-3-Instruct: header-delimited turns, contents trimmed */
     "{%- for message in messages %}\n"
     "    {%- if loop.first %}{{- '<|begin_of_text|>' }}{% endif %}\n"
     "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
     "{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n"
     "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
     "{%- endif %}\n"},
    {"mistral",   /* Mistral-7B-Instruct v0.3: the system prompt joins the last user turn */
     "{%- if messages and messages[0]['role'] == 'system' %}\n"
     "    {%- set system_message = messages[0]['content'] %}\n"
     "    {%- set loop_messages = messages[1:] %}\n"
     "{%- else %}\n"
     "    {%- set loop_messages = messages %}\n"
     "{%- endif %}\n"
     "{{- '<s>' }}\n"
     "{%- for message in loop_messages %}\n"
     "    {%- if message['role'] != 'user' and message['role'] != 'assistant' %}\n"
     "        {{- raise_exception('mistral: only user and assistant roles are supported, after an optional system message') }}\n"
     "    {%- elif (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
     "        {{- raise_exception('mistral: after an optional system message, roles must alternate user/assistant/user/...') }}\n"
     "    {%- endif %}\n"
     "    {%- if message['role'] == 'user' %}\n"
     "        {%- if loop.last and system_message is defined %}\n"
     "            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}\n"
     "        {%- else %}\n"
     "            {{- '[INST] ' + message['content'] + '[/INST]' }}\n"
     "        {%- endif %}\n"
     "    {%- else %}\n"
     "        {{- ' ' + message['content'] | trim + '</s>' }}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"},
    {"qwen3",   /* Qwen3: ChatML with <think> blocks kept only after the last user query */
     "{%- if messages and messages[0]['role'] == 'system' %}\n"
     "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
     "{%- endif %}\n"
     "{%- set ns = namespace(last_query_index=messages | length - 1) %}\n"
     "{%- for message in messages[::-1] %}\n"
     "    {%- if message['role'] == 'user' and message['content'] is string and not\n"
     "           (message['content'].startswith('<tool_response>') and message['content'].endswith('</tool_response>')) %}\n"
     "        {%- set ns.last_query_index = messages | length - 1 - loop.index0 %}\n"
     "        {%- break %}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"
     "{%- for message in messages %}\n"
     "    {%- set content = message['content'] if message['content'] is string else '' %}\n"
     "    {%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}\n"
     "        {{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}\n"
     "    {%- elif message['role'] == 'assistant' %}\n"
     "        {%- set reasoning = '' %}\n"
     "        {%- if '</think>' in content %}\n"
     "            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
     "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
     "        {%- endif %}\n"
     "        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}\n"
     "            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
     "        {%- else %}\n"
     "            {{- '<|im_start|>assistant\\n' + content }}\n"
     "        {%- endif %}\n"
     "        {{- '<|im_end|>\\n' }}\n"
     "    {%- elif message['role'] == 'tool' %}\n"
     "        {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}\n"
     "            {{- '<|im_start|>user' }}\n"
     "        {%- endif %}\n"
     "        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}\n"
     "        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}\n"
     "            {{- '<|im_end|>\\n' }}\n"
     "        {%- endif %}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n"
     "    {{- '<|im_start|>assistant\\n' }}\n"
     "{%- endif %}\n"},
};

const char *const chat_template_builtin_names[] = {"chatml", "llama2", "llama3", "mistral", "qwen3", NULL};

const char *chat_template_builtin_text(const char *name)
{
    for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++)
        if (strcmp(builtins[i].name, name) == 0) return builtins[i].text;
    return NULL;
}

// ---- parse ----

ct_chat_limits chat_template_default_limits(void)
{
    return (ct_chat_limits){.max_output = (size_t)32 << 20, .max_memory = (size_t)256 << 20, .max_steps = 20000000};
}

/* The first ill-formed UTF-8 byte of s, or n. */
static size_t utf8_first_bad(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t at = i;
        uint32_t cp = jt_utf8_next(s, n, &i);
        if (cp >= 0xDC80 && cp <= 0xDCFF) return at;
    }
    return n;
}

static ct_chat_template *parse_as(const char *text, size_t len, const char *name, const char *source, const char *bos,
                                  const char *eos, ct_error *err)
{
    if (len > CT_CHAT_TEMPLATE_MAX_BYTES) {
        CT_FAIL_INPUT(err, "%s: the chat template is %zu bytes, more than the %zu-byte limit", source, len,
                      CT_CHAT_TEMPLATE_MAX_BYTES);
        return NULL;
    }
    ct_chat_template *t = ct_calloc(1, sizeof *t);
    t->name = ct_strdup(name);
    t->source = ct_strdup(source);
    t->bos = bos ? ct_strdup(bos) : NULL;
    t->eos = eos ? ct_strdup(eos) : NULL;
    t->limits = chat_template_default_limits();
    t->text = ct_malloc(len + 1);
    for (size_t i = 0; i < len; i++) {   /* jinja2: \r\n and \r are \n; one trailing newline goes */
        if (text[i] == '\r') {
            t->text[t->len++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n') i++;
        } else {
            t->text[t->len++] = text[i];
        }
    }
    if (t->len && t->text[t->len - 1] == '\n') t->len--;
    t->text[t->len] = 0;
    /* on the heap: what a longjmp returns to must not be a local changed since setjmp */
    jt_ctx *c = ct_malloc(sizeof *c);
    jt_ctx_init(c, t->text, t->len, t->source, err, (size_t)512 << 20, (size_t)-1);
    size_t bad = utf8_first_bad(t->text, t->len);
    if (setjmp(c->jump)) {
        jt_pool_free(c->chunks);
        free(c);
        chat_template_free(t);
        return NULL;
    }
    if (bad < t->len) jt_fail(c, bad, "not UTF-8 (byte 0x%02x)", (unsigned char)t->text[bad]);
    size_t n_tokens;
    jt_token *tokens = jt_lex(c, &n_tokens);
    t->body = jt_parse(c, tokens, n_tokens);
    t->pool = c->chunks;
    t->has_generation = source_has_generation(t->text, t->len);
    free(c);
    return t;
}

ct_chat_template *chat_template_parse(const char *text, size_t len, const char *name, const char *bos,
                                      const char *eos, ct_error *err)
{
    return parse_as(text, len, name, name, bos, eos, err);
}

// ---- loading ----

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A special token of tokenizer_config.json: a string, or an AddedToken {"content": ...}. */
static const char *config_token(const json_value *root, const char *key)
{
    const json_value *v = json_get(root, key);
    if (v && v->type == JSON_OBJECT) v = json_get(v, "content");
    return v && v->type == JSON_STRING ? v->string : NULL;
}

/* tokenizer_config.json's chat_template: a string, or [{"name", "template"}] (the "default" one). */
static int config_template(const json_value *root, const char *path, const char **text, size_t *len, ct_error *err)
{
    const json_value *ct = json_get(root, "chat_template");
    *text = NULL;
    if (!ct || ct->type == JSON_NULL) return CT_OK;
    if (ct->type == JSON_STRING) {
        *text = ct->string;
        *len = ct->string_len;
        return CT_OK;
    }
    if (ct->type != JSON_ARRAY)
        return CT_FAIL_INPUT(err, "%s: chat_template: expected a string or a list of {name, template}", path);
    char names[256] = "";
    for (size_t i = 0; i < ct->count; i++) {
        const json_value *name = json_get_type(ct->items[i], "name", JSON_STRING);
        const json_value *tmpl = json_get_type(ct->items[i], "template", JSON_STRING);
        if (!name || !tmpl) return CT_FAIL_INPUT(err, "%s: chat_template[%zu]: expected {\"name\": ..., \"template\": ...}", path, i);
        if (strcmp(name->string, "default") == 0) {
            *text = tmpl->string;
            *len = tmpl->string_len;
            return CT_OK;
        }
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'", i ? ", " : "", name->string);
    }
    for (char *q = names; *q; q++) /* the names are the file's: the message stays one line */
        if ((unsigned char)*q < 0x20) *q = '?';
    return CT_FAIL_INPUT(err, "%s: chat_template lists no template named 'default' (it has %s); "
                         "HINT: pick one with --chat-template FILE", path, names);
}

static ct_chat_template *load_file(const char *path, const char *name, const char *source, const char *bos,
                                   const char *eos, ct_error *err)
{
    size_t len;
    char *text = ct_read_file_max(path, CT_CHAT_TEMPLATE_MAX_BYTES, &len, err);
    if (!text) return NULL;
    ct_chat_template *t = parse_as(text, len, name, source, bos, eos, err);
    free(text);
    return t;
}

ct_chat_template *chat_template_load(const char *model_dir, const char *override, ct_error *err)
{
    char config_path[4096], jinja_path[4096];
    json_doc *config = NULL;
    const json_value *root = NULL;
    if (model_dir) {
        snprintf(config_path, sizeof config_path, "%s/tokenizer_config.json", model_dir);
        snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", model_dir);
        if (file_exists(config_path)) {
            if (!(config = json_parse_file(config_path, err))) return NULL;
            root = json_root(config);
        }
    }
    const char *bos = root ? config_token(root, "bos_token") : NULL, *eos = root ? config_token(root, "eos_token") : NULL;
    ct_chat_template *t = NULL;
    if (override) {
        const char *builtin = chat_template_builtin_text(override);
        char source[256];
        snprintf(source, sizeof source, "built-in chat template '%s'", override);
        struct stat st;
        bool is_file = !builtin && stat(override, &st) == 0 && S_ISREG(st.st_mode);
        if (builtin) t = parse_as(builtin, strlen(builtin), override, source, bos, eos, err);
        else if (is_file) t = load_file(override, override, override, bos, eos, err);
        else
            CT_FAIL_INPUT(err, "--chat-template %s: not a built-in (chatml, llama2, llama3, mistral, qwen3) and not a file (%s)",
                          override, stat(override, &st) == 0 ? "not a regular file" : strerror(errno));
    } else if (!model_dir) {
        CT_FAIL_INPUT(err, "no chat template: no model folder and no --chat-template NAME|FILE");
    } else if (file_exists(jinja_path)) {   /* transformers prefers it to tokenizer_config.json's */
        t = load_file(jinja_path, "model", jinja_path, bos, eos, err);
    } else {
        const char *text = NULL;
        size_t len = 0;
        char source[4200];
        snprintf(source, sizeof source, "%s (chat_template)", config_path);
        if (root && config_template(root, config_path, &text, &len, err) != CT_OK) {
            json_free(config);
            return NULL;
        }
        if (text) t = parse_as(text, len, "model", source, bos, eos, err);
        else
            CT_FAIL_INPUT(err, "%s: no chat template (no chat_template.jinja and no chat_template in tokenizer_config.json); "
                          "HINT: pass --chat-template NAME (chatml, llama2, llama3, mistral, qwen3) or a .jinja FILE", model_dir);
    }
    json_free(config);
    return t;
}

bool chat_template_has_generation(const ct_chat_template *t) { return t->has_generation; }

const char *chat_template_name(const ct_chat_template *t) { return t->name; }

void chat_template_free(ct_chat_template *t)
{
    if (!t) return;
    jt_pool_free(t->pool);
    free(t->name);
    free(t->source);
    free(t->text);
    free(t->bos);
    free(t->eos);
    free(t);
}

void chat_template_set_date(ct_chat_template *t, const struct tm *date)
{
    t->has_date = date != NULL;
    if (date) t->date = *date;
}

void chat_template_set_limits(ct_chat_template *t, const ct_chat_limits *limits) { t->limits = *limits; }

// ---- render ----

int chat_template_render(const ct_chat_template *t, const ct_chat_message *msgs, int n,
                         bool add_generation_prompt, char **out, size_t *len, ct_error *err)
{
    return chat_template_render_spans(t, msgs, n, add_generation_prompt, out, len, NULL, NULL, err);
}

int chat_template_render_spans(const ct_chat_template *t, const ct_chat_message *msgs, int n,
                               bool add_generation_prompt, char **out, size_t *len, ct_chat_span **spans,
                               size_t *n_spans, ct_error *err)
{
    *out = NULL;
    *len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    if (n < 0 || (n > 0 && !msgs)) return CT_FAIL_INPUT(err, "%s: %d messages to render", t->source, n);
    for (int i = 0; i < n; i++)
        if (!msgs[i].role) return CT_FAIL_INPUT(err, "%s: message %d has no role", t->source, i);
    jt_render *r = ct_calloc(1, sizeof *r);   /* on the heap, as in parse_as */
    r->max_output = t->limits.max_output;
    r->date = t->has_date ? &t->date : NULL;
    jt_ctx_init(&r->c, t->text, t->len, t->source, err, t->limits.max_memory, t->limits.max_steps);
    if (setjmp(r->c.jump)) {
        jt_pool_free(r->c.chunks);
        free(r);
        return err ? err->code : CT_ERR_INPUT;
    }
    jt_ctx *c = &r->c;
    jt_scope *g = r->globals = jt_scope_new(r, NULL);
    jt_value messages = jt_list_v(c, (size_t)n, JT_SEQ_LIST);
    for (int i = 0; i < n; i++) {
        jt_value m = jt_dict_v(c, JT_DICT);
        jt_dict_set(c, m.dict, jt_cstr_v("role"), jt_cstr_v(msgs[i].role));
        jt_dict_set(c, m.dict, jt_cstr_v("content"), msgs[i].content ? jt_cstr_v(msgs[i].content) : jt_none_v());
        messages.list->items[i] = m;
    }
    jt_scope_set(r, g, "messages", messages);
    jt_scope_set(r, g, "add_generation_prompt", jt_bool_v(add_generation_prompt));
    jt_scope_set(r, g, "tools", jt_none_v());
    jt_scope_set(r, g, "documents", jt_none_v());
    if (t->bos) jt_scope_set(r, g, "bos_token", jt_cstr_v(t->bos));
    if (t->eos) jt_scope_set(r, g, "eos_token", jt_cstr_v(t->eos));
    jt_buf *text = jt_alloc(c, sizeof *text);
    text->max = t->limits.max_output;
    r->out = r->top = text;
    r->track = spans && n_spans;
    jt_render_body(r, g, &t->body);
    *out = ct_malloc(text->n + 1);
    if (text->n) memcpy(*out, text->p, text->n);
    (*out)[text->n] = 0;
    *len = text->n;
    if (r->track && r->n_spans) {
        *spans = ct_malloc(r->n_spans * sizeof **spans);
        for (size_t k = 0; k < r->n_spans; k++) {   /* end: characters from start (eval's render_generation) */
            size_t at = r->spans[k].start, chars = r->spans[k].end;
            for (; chars && at < text->n; chars--) jt_utf8_next(text->p, text->n, &at);
            (*spans)[k] = (ct_chat_span){r->spans[k].start, at + chars};
        }
        *n_spans = r->n_spans;
    }
    jt_pool_free(r->c.chunks);
    free(r);
    return CT_OK;
}
