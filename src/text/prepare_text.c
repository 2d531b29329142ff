/* prepare_text.c — one record of text -> one document (prepare_text.h has the
 * rules). A record is parsed into a JSON tree (records of text are small next
 * to the ~80 bytes a node costs; token-id lines, which are not, have their own
 * scanner in prepare_tokens.c), checked field by field, rendered and encoded;
 * every buffer lives in the worker and is reused from record to record. */
#include "prepare_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text_match.h"

const char *const prepare_format_names[] = {"auto", "messages", "sharegpt", "alpaca", "prompt_completion",
                                            "text", "tokens", NULL};

int prepare_format_parse(const char *name, prepare_format *out, ct_error *err)
{
    for (int i = 0; prepare_format_names[i]; i++)
        if (!strcmp(name, prepare_format_names[i])) {
            *out = (prepare_format)i;
            return CT_OK;
        }
    return CT_FAIL_INPUT(err, "--format '%s': expected auto, messages, sharegpt, alpaca, prompt_completion, text "
                         "or tokens", name);
}

bool prepare_format_is_chat(prepare_format f)
{
    return f == PREPARE_FORMAT_MESSAGES || f == PREPARE_FORMAT_SHAREGPT || f == PREPARE_FORMAT_ALPACA;
}

struct prepare_worker {
    ct_ids ids, prompt_ids;
    ct_spans spans;
    uint8_t *mask;
    size_t mask_cap;
    ct_chat_message *msgs;
    size_t msgs_cap;
    size_t *turns;           /* start, end of each assistant turn in the rendering */
    size_t turns_cap;
    char *buf;               /* a user turn or prompt + completion, built here */
    size_t buf_cap;
    json_doc *eval_doc;      /* the record prepare_eval_record points into */
};

prepare_worker *prepare_worker_new(void) { return ct_calloc(1, sizeof(prepare_worker)); }

void prepare_worker_free(prepare_worker *w)
{
    if (!w) return;
    ct_ids_free(&w->ids);
    ct_ids_free(&w->prompt_ids);
    ct_spans_free(&w->spans);
    free(w->mask);
    free(w->msgs);
    free(w->turns);
    free(w->buf);
    json_free(w->eval_doc);
    free(w);
}

static void *grow(void *p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) return p;
    *cap = need > 2 * *cap ? need : 2 * *cap;
    return ct_realloc(p, *cap * size);
}

static const char *type_name(const json_value *v)
{
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return v ? names[v->type] : "nothing";
}

// ---- keys and formats ----

static const char *key_messages(const prepare_fields *f, prepare_format fmt)
{
    return f->messages ? f->messages : fmt == PREPARE_FORMAT_SHAREGPT ? "conversations" : "messages";
}
static const char *key_role(const prepare_fields *f, prepare_format fmt)
{
    return f->role ? f->role : fmt == PREPARE_FORMAT_SHAREGPT ? "from" : "role";
}
static const char *key_content(const prepare_fields *f, prepare_format fmt)
{
    return f->content ? f->content : fmt == PREPARE_FORMAT_SHAREGPT ? "value" : "content";
}
static const char *key_text(const prepare_fields *f) { return f->text ? f->text : "text"; }
static const char *key_prompt(const prepare_fields *f) { return f->prompt ? f->prompt : "prompt"; }
static const char *key_completion(const prepare_fields *f) { return f->completion ? f->completion : "completion"; }

/* The record's JSON object; CT_ERR_INPUT for anything else. */
static json_doc *parse_record(const char *rec, size_t len, const char *src, const json_value **root, ct_error *err)
{
    json_doc *d = json_parse(rec, len, src, err);
    if (!d) return NULL;
    *root = json_root(d);
    if ((*root)->type != JSON_OBJECT) {
        CT_FAIL_INPUT(err, "%s: expected a JSON object, found %s", src, type_name(*root));
        json_free(d);
        return NULL;
    }
    return d;
}

static bool has(const json_value *o, const char *key) { return json_get(o, key) != NULL; }

/* A comma-separated list of the object's keys, for "found keys ..." messages. */
static void list_keys(const json_value *o, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < o->count && n + 1 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\"", i ? ", " : "", o->keys[i]);
    if (!o->count) snprintf(buf, cap, "none");
}

/* Detection reads only the keys at the top of a record (a line of token ids
 * can be 100 MB: no tree is built for it). */
static size_t skip_string(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '"') return i + 1;
    }
    return n + 1;
}

static size_t skip_ws_at(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) i++;
    return i;
}

static size_t skip_value(const char *s, size_t n, size_t i)
{
    if (i < n && s[i] == '"') return skip_string(s, n, i);
    int depth = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (c == '"') {
            i = skip_string(s, n, i) - 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return i;
            if (--depth == 0) return i + 1;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n')) {
            return i;
        }
    }
    return depth ? n + 1 : n;
}

/* The value of top-level key in the object rec (plain keys, no escapes); false
 * when it has none, or rec is not an object that scans (*bad). */
static bool member(const char *s, size_t n, const char *key, const char **val, size_t *vlen, bool *bad)
{
    size_t kl = strlen(key), i = skip_ws_at(s, n, 0);
    *bad = true;
    if (i >= n || s[i] != '{') return false;
    for (i = skip_ws_at(s, n, i + 1); i < n && s[i] != '}';) {
        if (s[i] != '"') return false;
        size_t k = i + 1, e = skip_string(s, n, i);
        if (e > n) return false;
        i = skip_ws_at(s, n, e);
        if (i >= n || s[i] != ':') return false;
        size_t v = skip_ws_at(s, n, i + 1), ve = skip_value(s, n, v);
        if (ve > n || ve == v) return false;
        if (e - 1 - k == kl && !memcmp(s + k, key, kl)) {
            *val = s + v;
            *vlen = ve - v;
            *bad = false;
            return true;
        }
        i = skip_ws_at(s, n, ve);
        if (i < n && s[i] == ',') i = skip_ws_at(s, n, i + 1);
        else if (i >= n || s[i] != '}') return false;
    }
    *bad = i >= n;
    return false;
}

int prepare_detect_format(const char *rec, size_t len, const char *src, const prepare_fields *f,
                          prepare_format *out, ct_error *err)
{
    const char *v;
    size_t vl;
    bool bad;
#define HAS(key) (member(rec, len, (key), &v, &vl, &bad))
    if (HAS("input_ids")) {
        *out = PREPARE_FORMAT_TOKENS;
        return CT_OK;
    }
    if (!bad && HAS(key_messages(f, PREPARE_FORMAT_MESSAGES))) {
        /* sharegpt when the first turn has "from" and no role key */
        json_doc *d = json_parse(v, vl, src, err);
        if (!d) *err = (ct_error){0};
        const json_value *m = d ? json_root(d) : NULL, *first = m && m->type == JSON_ARRAY && m->count ? m->items[0] : NULL;
        bool share = first && first->type == JSON_OBJECT && has(first, "from") &&
                     !has(first, key_role(f, PREPARE_FORMAT_MESSAGES));
        *out = share ? PREPARE_FORMAT_SHAREGPT : PREPARE_FORMAT_MESSAGES;
        json_free(d);
        return CT_OK;   /* a malformed list is the record's error, found when it is read */
    }
    if (!bad) {
        const char *p = key_prompt(f), *c = key_completion(f);
        if (HAS("conversations")) *out = PREPARE_FORMAT_SHAREGPT;
        else if (HAS(p) && HAS(c)) *out = PREPARE_FORMAT_PROMPT_COMPLETION;
        else if (HAS("instruction") && HAS("output")) *out = PREPARE_FORMAT_ALPACA;
        else if (HAS(key_text(f))) *out = PREPARE_FORMAT_TEXT;
        else bad = true;
    }
#undef HAS
    if (!bad) return CT_OK;
    const json_value *r;   /* not a format: the full parse says why */
    json_doc *d = parse_record(rec, len, src, &r, err);
    if (!d) return err->code;
    char keys[512];
    list_keys(r, keys, sizeof keys);
    json_free(d);
    return CT_FAIL_INPUT(err, "%s: cannot tell the format from the keys (%s): expected input_ids, %s, conversations, "
                         "%s + %s, instruction + output or %s (or give --format)", src, keys,
                         key_messages(f, PREPARE_FORMAT_MESSAGES), key_prompt(f), key_completion(f), key_text(f));
}

/* CT_ERR_INPUT unless the record has the keys of the format. */
static int check_shape(const prepare_text_cfg *c, const json_value *r, const char *src, ct_error *err)
{
    const prepare_fields *f = &c->fields;
    const char *need[2] = {NULL, NULL};
    switch (c->format) {
    case PREPARE_FORMAT_MESSAGES: case PREPARE_FORMAT_SHAREGPT: need[0] = key_messages(f, c->format); break;
    case PREPARE_FORMAT_ALPACA: need[0] = "instruction"; need[1] = "output"; break;
    case PREPARE_FORMAT_PROMPT_COMPLETION: need[0] = key_prompt(f); need[1] = key_completion(f); break;
    default: need[0] = key_text(f); break;
    }
    for (int i = 0; i < 2; i++) {
        if (!need[i] || has(r, need[i])) continue;
        char keys[512];
        list_keys(r, keys, sizeof keys);
        if (c->detected_line)
            return CT_FAIL_INPUT(err, "%s: no \"%s\" key (found %s): not a %s record like line %zu, where the format "
                                 "was detected (give --format to choose one)", src, need[i], keys,
                                 prepare_format_names[c->format], c->detected_line);
        return CT_FAIL_INPUT(err, "%s: no \"%s\" key (found %s), which --format %s needs", src, need[i], keys,
                             prepare_format_names[c->format]);
    }
    return CT_OK;
}

/* obj[key] as a string (NUL-free, so the template sees all of it). */
static int get_string(const json_value *obj, const char *key, const char *field, const char *src, bool required,
                      const json_value **out, ct_error *err)
{
    const json_value *v = json_get(obj, key);
    *out = NULL;
    if (!v || (v->type == JSON_NULL && !required)) {
        if (required) return CT_FAIL_INPUT(err, "%s: %s is missing", src, field);
        return CT_OK;
    }
    if (v->type != JSON_STRING) return CT_FAIL_INPUT(err, "%s: %s: expected a string, found %s", src, field, type_name(v));
    if (strlen(v->string) != v->string_len) return CT_FAIL_INPUT(err, "%s: %s holds a NUL character", src, field);
    *out = v;
    return CT_OK;
}

// ---- conversations ----

/* Appends the messages of list (a JSON array at field) to w->msgs[*n..]. */
static int add_messages(const prepare_text_cfg *c, prepare_worker *w, const json_value *list, const char *field,
                        prepare_format fmt, const char *src, int *n, ct_error *err)
{
    if (!list || list->type != JSON_ARRAY)
        return CT_FAIL_INPUT(err, "%s: %s: expected a list of messages, found %s", src, field, type_name(list));
    const char *rk = key_role(&c->fields, fmt), *ck = key_content(&c->fields, fmt);
    w->msgs = grow(w->msgs, &w->msgs_cap, (size_t)*n + list->count + 1, sizeof *w->msgs);
    for (size_t i = 0; i < list->count; i++) {
        const json_value *m = list->items[i], *role, *content;
        char where[160];
        if (m->type != JSON_OBJECT)
            return CT_FAIL_INPUT(err, "%s: %s[%zu]: expected an object, found %s", src, field, i, type_name(m));
        snprintf(where, sizeof where, "%s[%zu].%s", field, i, rk);
        int rc = get_string(m, rk, where, src, true, &role, err);
        snprintf(where, sizeof where, "%s[%zu].%s", field, i, ck);
        if (!rc) rc = get_string(m, ck, where, src, true, &content, err);
        if (rc) return rc;
        const char *r = role->string;
        if (fmt == PREPARE_FORMAT_SHAREGPT) r = !strcmp(r, "human") ? "user" : !strcmp(r, "gpt") ? "assistant" : r;
        w->msgs[(*n)++] = (ct_chat_message){r, content->string};
    }
    if (*n > INT32_MAX / 2) return CT_FAIL_INPUT(err, "%s: %s: too many messages", src, field);
    return CT_OK;
}

/* w->msgs[0..n) rendered; spans (NULL: not wanted) gets the generation blocks' spans. */
static int render_spans(const prepare_text_cfg *c, const prepare_worker *w, int n, bool gen, const char *src,
                        char **out, size_t *len, ct_chat_span **spans, size_t *n_spans, ct_error *err)
{
    if (!c->tmpl)
        return CT_FAIL_INPUT(err, "%s: a conversation needs a chat template: %s", src,
                             c->tmpl_error ? c->tmpl_error : "the model has none (see --chat-template)");
    int rc = chat_template_render_spans(c->tmpl, w->msgs, n, gen, out, len, spans, n_spans, err);
    if (rc) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        *out = NULL;
        return ct_fail(err, rc, "%s: chat template %s: %s", src, chat_template_name(c->tmpl), why);
    }
    return CT_OK;
}

static int render(const prepare_text_cfg *c, const prepare_worker *w, int n, bool gen, const char *src, char **out,
                  size_t *len, ct_error *err)
{
    return render_spans(c, w, n, gen, src, out, len, NULL, NULL, err);
}

/* The assistant turns of w->msgs[0..n) in full[0..flen): w->turns, *n_turns. */
static int find_turns(const prepare_text_cfg *c, prepare_worker *w, int n, const char *full, size_t flen,
                      const char *src, size_t *n_turns, ct_error *err)
{
    size_t cursor = 0, k = 0;
    int rc = CT_OK;
    for (int i = 0; i < n && rc == CT_OK; i++) {
        if (strcmp(w->msgs[i].role, "assistant")) continue;
        if (i == 0)
            return CT_FAIL_INPUT(err, "%s: the conversation starts with an assistant message; the assistant mask "
                                 "needs a message before it (or --train-on-inputs)", src);
        char *prefix = NULL, *upto = NULL;
        size_t plen, ulen;
        rc = render(c, w, i, true, src, &prefix, &plen, err);
        if (!rc) rc = render(c, w, i + 1, false, src, &upto, &ulen, err);
        if (!rc && (ulen < plen || memcmp(upto, prefix, plen)))
            rc = CT_FAIL_INPUT(err, "%s: the chat template renders the prompt before assistant message %d differently "
                               "with and without the reply, so the reply cannot be told from it", src, i);
        if (!rc) {
            size_t tlen = text_rstrip(upto + plen, ulen - plen);
            const char *hit = tlen == 0 ? full + cursor : memmem(full + cursor, flen - cursor, upto + plen, tlen);
            if (!hit)
                rc = CT_FAIL_INPUT(err, "%s: the chat template renders assistant message %d differently once later "
                                   "turns follow, so its tokens cannot be found", src, i);
            else {
                w->turns = grow(w->turns, &w->turns_cap, 2 * k + 2, sizeof *w->turns);
                w->turns[2 * k] = (size_t)(hit - full);
                w->turns[2 * k + 1] = cursor = (size_t)(hit - full) + tlen;
                k++;
            }
        }
        free(prefix);
        free(upto);
    }
    *n_turns = k;
    return rc;
}

static void mask_reserve(prepare_worker *w, size_t n) { w->mask = grow(w->mask, &w->mask_cap, n ? n : 1, 1); }

/* HF's char_to_token: the first token whose span holds the character at byte b; -1 when none. */
static ptrdiff_t token_at(const ct_spans *sp, size_t b)
{
    for (size_t j = 0; j < sp->len; j++)
        if (sp->data[2 * j] <= b && b < sp->data[2 * j + 1]) return (ptrdiff_t)j;
    return -1;
}

/* transformers' assistant mask (apply_chat_template, return_assistant_tokens_mask) over
 * w->ids / w->spans of full[0..flen), from the generation spans g[0..n_g), as its loop has it. */
static int generation_mask(prepare_worker *w, const char *full, size_t flen, const ct_chat_span *g, size_t n_g,
                           const char *src, ct_error *err)
{
    memset(w->mask, 0, w->ids.len);
    for (size_t k = 0; k < n_g; k++) {
        if (g[k].end == 0)   /* char_to_token(-1): Python's OverflowError */
            return CT_FAIL_INPUT(err, "%s: an empty generation block opens the rendering, where transformers' "
                                 "assistant mask fails", src);
        ptrdiff_t first = g[k].start < flen ? token_at(&w->spans, g[k].start) : -1, last = -1;
        if (g[k].end <= flen) {
            size_t c = g[k].end - 1;   /* the first byte of the span's last character */
            while (c > 0 && ((unsigned char)full[c] & 0xC0) == 0x80) c--;
            last = token_at(&w->spans, c);
        }
        if (first < 0) break;   /* HF: "out of bounds maybe due to truncation": no later span either */
        size_t end = last > 0 ? (size_t)last + 1 : w->ids.len;   /* HF's `end_token + 1 if end_token`: 0 too */
        for (size_t j = (size_t)first; j < end; j++) w->mask[j] = 1;
    }
    return CT_OK;
}

/* A conversation of w->msgs[0..n) rendered, encoded and masked into w->ids / w->mask. */
static int chat_doc(const prepare_text_cfg *c, prepare_worker *w, int n, const char *src, ct_error *err)
{
    bool any_assistant = false;
    for (int i = 0; i < n; i++) any_assistant |= !strcmp(w->msgs[i].role, "assistant");
    if (n == 0) return CT_FAIL_INPUT(err, "%s: %s: the conversation is empty", src, key_messages(&c->fields, c->format));
    if (!any_assistant && !c->train_on_inputs)
        return CT_FAIL_INPUT(err, "%s: no assistant message, so no token would carry loss (or --train-on-inputs)", src);
    char *full;
    size_t flen, n_turns = 0, n_gen = 0;
    ct_chat_span *gen = NULL;
    bool generation = !c->train_on_inputs && c->tmpl && chat_template_has_generation(c->tmpl);
    int rc = render_spans(c, w, n, false, src, &full, &flen, generation ? &gen : NULL, generation ? &n_gen : NULL, err);
    if (rc) return rc;
    if (c->train_on_inputs) {
        rc = tokenizer_encode(c->enc->tok, full, flen, true, &w->ids, err);
        mask_reserve(w, w->ids.len);
        memset(w->mask, 1, w->ids.len);
    } else {
        if (!generation) rc = find_turns(c, w, n, full, flen, src, &n_turns, err);
        if (!rc) rc = tokenizer_encode_offsets(c->enc->tok, full, flen, true, &w->ids, &w->spans, err);
        if (!rc) {
            text_encoder_trim_spans(c->enc, &w->ids, &w->spans, 0);
            mask_reserve(w, w->ids.len);
            if (generation) rc = generation_mask(w, full, flen, gen, n_gen, src, err);
            size_t t = 0, labels = 0;
            for (size_t j = 0; j < w->ids.len && !rc; j++) {
                if (!generation) {
                    size_t s = w->spans.data[2 * j], e = w->spans.data[2 * j + 1];
                    while (t < n_turns && w->turns[2 * t + 1] <= s) t++;
                    w->mask[j] = t < n_turns && s < w->turns[2 * t + 1] && e > w->turns[2 * t];
                }
                labels += w->mask[j];
            }
            if (!rc && !labels) rc = CT_FAIL_INPUT(err, "%s: the chat template marked no assistant token", src);
        }
    }
    free(gen);
    free(full);
    return rc;
}

// ---- the formats ----

static char *build(prepare_worker *w, const char *a, size_t an, const char *sep, const char *b, size_t bn)
{
    size_t sn = sep ? strlen(sep) : 0;
    w->buf = grow(w->buf, &w->buf_cap, an + sn + bn + 1, 1);
    memcpy(w->buf, a, an);
    if (sn) memcpy(w->buf + an, sep, sn);
    memcpy(w->buf + an + sn, b, bn);
    w->buf[an + sn + bn] = 0;
    return w->buf;
}

static int alpaca_doc(const prepare_text_cfg *c, prepare_worker *w, const json_value *r, const char *src, ct_error *err)
{
    const json_value *ins, *in, *out;
    int rc = get_string(r, "instruction", "instruction", src, true, &ins, err);
    if (!rc) rc = get_string(r, "input", "input", src, false, &in, err);
    if (!rc) rc = get_string(r, "output", "output", src, true, &out, err);
    if (rc) return rc;
    bool with_input = in && in->string_len;
    const char *user = build(w, ins->string, ins->string_len, with_input ? "\n\n" : NULL,
                             with_input ? in->string : "", with_input ? in->string_len : 0);
    w->msgs = grow(w->msgs, &w->msgs_cap, 2, sizeof *w->msgs);
    w->msgs[0] = (ct_chat_message){"user", user};
    w->msgs[1] = (ct_chat_message){"assistant", out->string};
    return chat_doc(c, w, 2, src, err);
}

/* The first k tokens of w->ids are the prompt's: no loss (unless --train-on-inputs). */
static void mask_after(const prepare_text_cfg *c, prepare_worker *w, size_t k)
{
    mask_reserve(w, w->ids.len);
    if (k > w->ids.len) k = w->ids.len;
    memset(w->mask, c->train_on_inputs ? 1 : 0, k);
    memset(w->mask + k, 1, w->ids.len - k);
}

static int prompt_completion_doc(const prepare_text_cfg *c, prepare_worker *w, const json_value *r, const char *src,
                                 bool *mismatched, ct_error *err)
{
    const char *pk = key_prompt(&c->fields), *ck = key_completion(&c->fields);
    const json_value *p = json_get(r, pk), *q = json_get(r, ck);
    int rc = CT_OK;
    w->prompt_ids.len = 0;
    if (p->type == JSON_ARRAY || q->type == JSON_ARRAY) {
        if (p->type != q->type)
            return CT_FAIL_INPUT(err, "%s: %s is %s and %s is %s: give two strings or two lists of messages", src, pk,
                                 type_name(p), ck, type_name(q));
        int n = 0, n_prompt;
        rc = add_messages(c, w, p, pk, PREPARE_FORMAT_MESSAGES, src, &n, err);
        n_prompt = n;
        if (!rc) rc = add_messages(c, w, q, ck, PREPARE_FORMAT_MESSAGES, src, &n, err);
        char *text = NULL;
        size_t len;
        if (!rc && n_prompt == 0) rc = CT_FAIL_INPUT(err, "%s: %s: the prompt has no messages", src, pk);
        if (!rc) rc = render(c, w, n_prompt, true, src, &text, &len, err);
        if (!rc) rc = tokenizer_encode(c->enc->tok, text, len, true, &w->prompt_ids, err);
        free(text);
        text = NULL;
        if (!rc) rc = render(c, w, n, false, src, &text, &len, err);
        if (!rc) rc = tokenizer_encode(c->enc->tok, text, len, true, &w->ids, err);
        free(text);
    } else {
        const json_value *ps, *cs;
        rc = get_string(r, pk, pk, src, true, &ps, err);
        if (!rc) rc = get_string(r, ck, ck, src, true, &cs, err);
        if (rc) return rc;
        const char *eos = c->enc->eos_token;
        size_t el = eos ? strlen(eos) : 0;
        bool add_eos = el && !(cs->string_len >= el && !memcmp(cs->string + cs->string_len - el, eos, el));
        rc = text_encoder_encode(c->enc, ps->string, ps->string_len, &w->prompt_ids, err);
        if (!rc) {
            build(w, ps->string, ps->string_len, NULL, cs->string, cs->string_len);
            size_t n = ps->string_len + cs->string_len;
            if (add_eos) {
                w->buf = grow(w->buf, &w->buf_cap, n + el + 1, 1);
                memcpy(w->buf + n, eos, el + 1);
                n += el;
            }
            rc = text_encoder_encode(c->enc, w->buf, n, &w->ids, err);
        }
    }
    if (rc) return rc;
    size_t k = w->prompt_ids.len;
    *mismatched = k > w->ids.len || memcmp(w->prompt_ids.data, w->ids.data, k * sizeof *w->ids.data);
    mask_after(c, w, k);
    return CT_OK;
}

static int text_doc(const prepare_text_cfg *c, prepare_worker *w, const json_value *r, const char *src, ct_error *err)
{
    const json_value *t;
    const char *key = key_text(&c->fields);
    int rc = get_string(r, key, key, src, true, &t, err);
    if (rc) return rc;
    if (!t->string_len) return CT_FAIL_INPUT(err, "%s: %s: the text is empty", src, key);
    rc = text_encoder_encode(c->enc, t->string, t->string_len, &w->ids, err);
    if (rc) return rc;
    if (c->enc->has_eos_id && (!w->ids.len || w->ids.data[w->ids.len - 1] != c->enc->eos_id))
        ct_ids_push(&w->ids, c->enc->eos_id);
    mask_after(c, w, 0);
    return CT_OK;
}

int prepare_text_record(const prepare_text_cfg *c, prepare_worker *w, const char *rec, size_t len,
                        const char *src, prepare_doc *doc, ct_error *err)
{
    const json_value *r;
    *doc = (prepare_doc){0};
    w->ids.len = 0;
    w->spans.len = 0;
    json_doc *d = parse_record(rec, len, src, &r, err);
    if (!d) return err->code;
    int rc = check_shape(c, r, src, err), n = 0;
    if (rc == CT_OK) {
        switch (c->format) {
        case PREPARE_FORMAT_MESSAGES:
        case PREPARE_FORMAT_SHAREGPT: {
            const char *key = key_messages(&c->fields, c->format);
            rc = add_messages(c, w, json_get(r, key), key, c->format, src, &n, err);
            if (!rc) rc = chat_doc(c, w, n, src, err);
            break;
        }
        case PREPARE_FORMAT_ALPACA: rc = alpaca_doc(c, w, r, src, err); break;
        case PREPARE_FORMAT_PROMPT_COMPLETION: rc = prompt_completion_doc(c, w, r, src, &doc->mismatched, err); break;
        default: rc = text_doc(c, w, r, src, err); break;
        }
    }
    json_free(d);
    if (rc && strncmp(err->msg, src, strlen(src))) {   /* the tokenizer's errors do not know the record */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = ct_fail(err, rc, "%s: %s", src, why);
    }
    if (rc) return rc;
    size_t n_ids = w->ids.len;
    if (n_ids == 0) return CT_FAIL_INPUT(err, "%s: the record encodes to no tokens", src);
    for (size_t i = 0; c->vocab_size && i < n_ids; i++)
        if (w->ids.data[i] >= c->vocab_size)
            return CT_FAIL_INPUT(err, "%s: token %zu has id %u >= vocab size %u (the tokenizer is larger than the "
                                 "model: check --vocab-size)", src, i, w->ids.data[i], c->vocab_size);
    if (c->max_length && n_ids > c->max_length) {
        doc->truncated = true;
        n_ids = c->max_length;
        size_t labels = 0;
        for (size_t i = 0; i < n_ids; i++) labels += w->mask[i];
        doc->dropped = labels == 0;
    }
    doc->ids = w->ids.data;
    doc->mask = w->mask;
    doc->len = n_ids;
    return CT_OK;
}

// ---- records of eval --generate ----

/* The last assistant message of w->msgs[first..n), or -1. */
static int last_assistant(const prepare_worker *w, int first, int n)
{
    for (int i = n - 1; i >= first; i--)
        if (!strcmp(w->msgs[i].role, "assistant")) return i;
    return -1;
}

/* The prompt is w->msgs[0..i) and the reference message i (of the list at key, from its index offset). */
static int eval_chat(prepare_worker *w, int i, int offset, const char *key, const char *content_key,
                     const char *src, prepare_eval_item *item, ct_error *err)
{
    if (i < 0)
        return CT_FAIL_INPUT(err, "%s: %s: no assistant message, so no reference (the last assistant message is the "
                             "reference)", src, key);
    if (i == 0)
        return CT_FAIL_INPUT(err, "%s: %s[0]: the assistant message to score has no prompt before it", src, key);
    item->msgs = w->msgs;
    item->n_msgs = i;
    item->reference = w->msgs[i].content;
    item->reference_len = strlen(item->reference);
    size_t s, e;
    text_strip(item->reference, item->reference_len, &s, &e);
    if (s == e)
        return CT_FAIL_INPUT(err, "%s: %s[%d].%s: the reference is empty (or only white space)", src, key,
                             i - offset, content_key);
    return CT_OK;
}

static int eval_fields(const prepare_text_cfg *c, prepare_worker *w, const json_value *r, const char *src,
                       prepare_eval_item *item, ct_error *err)
{
    int n = 0, rc = CT_OK;
    const json_value *ref = NULL;
    const char *ref_field = NULL;
    switch (c->format) {
    case PREPARE_FORMAT_MESSAGES:
    case PREPARE_FORMAT_SHAREGPT: {
        const char *key = key_messages(&c->fields, c->format);
        rc = add_messages(c, w, json_get(r, key), key, c->format, src, &n, err);
        return rc ? rc : eval_chat(w, last_assistant(w, 0, n), 0, key, key_content(&c->fields, c->format), src,
                                   item, err);
    }
    case PREPARE_FORMAT_ALPACA: {
        const json_value *ins, *in;
        rc = get_string(r, "instruction", "instruction", src, true, &ins, err);
        if (!rc) rc = get_string(r, "input", "input", src, false, &in, err);
        if (!rc) rc = get_string(r, "output", "output", src, true, &ref, err);
        if (rc) return rc;
        bool with_input = in && in->string_len;
        w->msgs = grow(w->msgs, &w->msgs_cap, 1, sizeof *w->msgs);
        w->msgs[0] = (ct_chat_message){"user", build(w, ins->string, ins->string_len, with_input ? "\n\n" : NULL,
                                                     with_input ? in->string : "", with_input ? in->string_len : 0)};
        item->msgs = w->msgs;
        item->n_msgs = 1;
        ref_field = "output";
        break;
    }
    default: {
        const char *pk = key_prompt(&c->fields), *ck = key_completion(&c->fields);
        const json_value *p = json_get(r, pk), *q = json_get(r, ck);
        if (p->type == JSON_ARRAY || q->type == JSON_ARRAY) {
            if (p->type != q->type)
                return CT_FAIL_INPUT(err, "%s: %s is %s and %s is %s: give two strings or two lists of messages",
                                     src, pk, type_name(p), ck, type_name(q));
            rc = add_messages(c, w, p, pk, PREPARE_FORMAT_MESSAGES, src, &n, err);
            int n_prompt = n;
            if (!rc) rc = add_messages(c, w, q, ck, PREPARE_FORMAT_MESSAGES, src, &n, err);
            if (rc) return rc;
            if (n_prompt == 0) return CT_FAIL_INPUT(err, "%s: %s: the prompt has no messages", src, pk);
            return eval_chat(w, last_assistant(w, n_prompt, n), n_prompt, ck, key_content(&c->fields, c->format),
                             src, item, err);
        }
        const json_value *ps;
        rc = get_string(r, pk, pk, src, true, &ps, err);
        if (!rc) rc = get_string(r, ck, ck, src, true, &ref, err);
        if (rc) return rc;
        if (!ps->string_len) return CT_FAIL_INPUT(err, "%s: %s: the prompt is empty", src, pk);
        item->prompt = ps->string;
        item->prompt_len = ps->string_len;
        ref_field = ck;
        break;
    }
    }
    item->reference = ref->string;
    item->reference_len = ref->string_len;
    size_t s, e;
    text_strip(ref->string, ref->string_len, &s, &e);
    if (s == e) return CT_FAIL_INPUT(err, "%s: %s: the reference is empty (or only white space)", src, ref_field);
    return CT_OK;
}

int prepare_eval_record(const prepare_text_cfg *c, prepare_worker *w, const char *rec, size_t len, const char *src,
                        prepare_eval_item *item, ct_error *err)
{
    *item = (prepare_eval_item){0};
    json_free(w->eval_doc);
    const json_value *r;
    w->eval_doc = parse_record(rec, len, src, &r, err);
    if (!w->eval_doc) return err->code;
    int rc = check_shape(c, r, src, err);
    return rc ? rc : eval_fields(c, w, r, src, item, err);
}
