/* text_encoder.c — see text_encoder.h. The post-processor is read from
 * tokenizer.json a second time (the tokenizer itself applies none: it is
 * HF's encode with add_special_tokens=False). */
#include "text_encoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

typedef struct pp_loader {
    ct_text_encoder *e;
    const char *src;
    ct_error *err;
    bool add_prefix_space;       /* of a trimming ByteLevel post-processor */
} pp_loader;

static void push_id(uint32_t **arr, size_t *n, uint32_t id)
{
    *arr = ct_realloc(*arr, (*n + 1) * sizeof **arr);
    (*arr)[(*n)++] = id;
}

/* A special token named in the post-processor, by its string, as an id. */
static int token_id(pp_loader *L, const char *field, const char *tok, uint32_t *id)
{
    if (tok && tokenizer_token_to_id(L->e->tok, tok, strlen(tok), id)) return CT_OK;
    return CT_FAIL_INPUT(L->err, "%s: %s: token '%s' is not in the vocabulary", L->src, field, tok ? tok : "");
}

/* TemplateProcessing's single template: SpecialTokens before and after {"Sequence": {"id": "A"}}. */
/* A post-processor's trim_offsets / add_prefix_space (ByteLevel, Roberta). */
static int load_offset_flags(pp_loader *L, const json_value *pp)
{
    bool trim = false, aps = false;
    int rc = json_get_bool(pp, "trim_offsets", false, &trim, L->src, L->err);
    if (!rc) rc = json_get_bool(pp, "add_prefix_space", false, &aps, L->src, L->err);
    L->e->trim_offsets |= trim;
    L->add_prefix_space |= trim && aps;
    return rc;
}

static int load_template(pp_loader *L, const json_value *pp, const char *field)
{
    const json_value *single = json_get_type(pp, "single", JSON_ARRAY);
    const json_value *specials = json_get_type(pp, "special_tokens", JSON_OBJECT);
    if (!single) return CT_FAIL_INPUT(L->err, "%s: %s.single: expected an array", L->src, field);
    bool after = false;
    for (size_t i = 0; i < single->count; i++) {
        const json_value *piece = single->items[i], *sp = json_get_type(piece, "SpecialToken", JSON_OBJECT);
        if (json_get_type(piece, "Sequence", JSON_OBJECT)) {
            after = true;
            continue;
        }
        const json_value *name = sp ? json_get_type(sp, "id", JSON_STRING) : NULL;
        if (!name)
            return CT_FAIL_INPUT(L->err, "%s: %s.single[%zu]: expected a SpecialToken or a Sequence", L->src, field, i);
        const json_value *def = specials ? json_get_type(specials, name->string, JSON_OBJECT) : NULL;
        const json_value *ids = def ? json_get_type(def, "ids", JSON_ARRAY) : NULL;
        if (!ids)
            return CT_FAIL_INPUT(L->err, "%s: %s.special_tokens: '%s' is missing or has no ids", L->src, field,
                                 name->string);
        for (size_t k = 0; k < ids->count; k++) {
            const json_value *v = ids->items[k];
            if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 0 ||
                (size_t)v->integer >= tokenizer_vocab_size(L->e->tok))
                return CT_FAIL_INPUT(L->err, "%s: %s.special_tokens['%s'].ids[%zu]: expected an id below %zu", L->src,
                                     field, name->string, k, tokenizer_vocab_size(L->e->tok));
            if (after) push_id(&L->e->suffix, &L->e->n_suffix, (uint32_t)v->integer);
            else push_id(&L->e->prefix, &L->e->n_prefix, (uint32_t)v->integer);
        }
    }
    return CT_OK;
}

/* Bert / Roberta: "cls": [token, id], "sep": [token, id]. */
static int load_cls_sep(pp_loader *L, const json_value *pp, const char *field)
{
    const char *keys[2] = {"cls", "sep"};
    for (int k = 0; k < 2; k++) {
        const json_value *v = json_get_type(pp, keys[k], JSON_ARRAY);
        const json_value *tok = v && v->count == 2 ? v->items[0] : NULL;
        uint32_t id;
        if (!tok || tok->type != JSON_STRING)
            return CT_FAIL_INPUT(L->err, "%s: %s.%s: expected [token, id]", L->src, field, keys[k]);
        int rc = token_id(L, field, tok->string, &id);
        if (rc) return rc;
        if (k == 0) push_id(&L->e->prefix, &L->e->n_prefix, id);
        else push_id(&L->e->suffix, &L->e->n_suffix, id);
    }
    return load_offset_flags(L, pp);
}

static int load_post_processor(pp_loader *L, const json_value *pp, const char *field, int depth)
{
    if (!pp || pp->type == JSON_NULL) return CT_OK;
    const json_value *type = json_get_type(pp, "type", JSON_STRING);
    if (!type || depth > 8) return CT_FAIL_INPUT(L->err, "%s: %s.type: expected a string", L->src, field);
    const char *t = type->string;
    if (!strcmp(t, "TemplateProcessing")) return load_template(L, pp, field);
    if (!strcmp(t, "BertProcessing") || !strcmp(t, "RobertaProcessing")) return load_cls_sep(L, pp, field);
    if (!strcmp(t, "ByteLevel")) return load_offset_flags(L, pp);
    if (!strcmp(t, "Sequence")) {
        const json_value *items = json_get_type(pp, "processors", JSON_ARRAY);
        if (!items) return CT_FAIL_INPUT(L->err, "%s: %s.processors: expected an array", L->src, field);
        for (size_t i = 0; i < items->count; i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", field, i);
            int rc = load_post_processor(L, items->items[i], sub, depth + 1);
            if (rc) return rc;
        }
        return CT_OK;
    }
    return CT_FAIL_INPUT(L->err, "%s: %s.type '%s' is not supported (expected TemplateProcessing, ByteLevel, "
                         "BertProcessing, RobertaProcessing or Sequence)", L->src, field, t);
}

static json_doc *read_json(const char *dir, const char *name, char *path, size_t cap, ct_error *err)
{
    snprintf(path, cap, "%s/%s", dir, name);
    return json_parse_file(path, err);
}

/* tokenizer_config.json's KEY: a string, or an added-token object's "content". */
static char *special_token(const json_value *cfg, const char *key)
{
    const json_value *v = json_get(cfg, key);
    if (v && v->type == JSON_OBJECT) v = json_get(v, "content");
    return v && v->type == JSON_STRING && v->string_len ? ct_strdup(v->string) : NULL;
}

static bool file_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

int text_encoder_load(ct_text_encoder *e, const char *model_dir, ct_error *err)
{
    memset(e, 0, sizeof *e);
    char path[4096];
    e->tok = tokenizer_load(model_dir, err);
    if (!e->tok) return err->code;
    json_doc *tj = read_json(model_dir, "tokenizer.json", path, sizeof path, err);
    if (!tj) return err->code;
    pp_loader L = {e, path, err, false};
    int rc = load_post_processor(&L, json_get(json_root(tj), "post_processor"), "post_processor", 0);
    json_free(tj);
    for (int k = 0; rc == CT_OK && k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", model_dir, k ? "config.json" : "tokenizer_config.json");
        if (!file_exists(path)) continue;
        json_doc *d = read_json(model_dir, k ? "config.json" : "tokenizer_config.json", path, sizeof path, err);
        if (!d) {
            rc = err->code;
            break;
        }
        const json_value *root = json_root(d);
        if (k == 0) {
            e->eos_token = special_token(root, "eos_token");
            e->bos_token = special_token(root, "bos_token");
        } else {
            const json_value *v = json_get_type(root, "vocab_size", JSON_NUMBER);
            const json_value *text_cfg = json_get_type(root, "text_config", JSON_OBJECT);
            if (!v && text_cfg) v = json_get_type(text_cfg, "vocab_size", JSON_NUMBER);
            if (v && v->is_integer && v->integer > 0 && v->integer <= UINT32_MAX) e->model_vocab_size = (uint32_t)v->integer;
        }
        json_free(d);
    }
    if (e->eos_token) e->has_eos_id = tokenizer_token_to_id(e->tok, e->eos_token, strlen(e->eos_token), &e->eos_id);
    if (e->bos_token) e->has_bos_id = tokenizer_token_to_id(e->tok, e->bos_token, strlen(e->bos_token), &e->bos_id);
    e->trim_keeps_first = L.add_prefix_space;
    if (rc) text_encoder_free(e);
    return rc;
}

void text_encoder_free(ct_text_encoder *e)
{
    tokenizer_free(e->tok);
    free(e->prefix);
    free(e->suffix);
    free(e->eos_token);
    free(e->bos_token);
    memset(e, 0, sizeof *e);
}

int text_encoder_encode(const ct_text_encoder *e, const char *text, size_t len, ct_ids *out, ct_error *err)
{
    for (size_t i = 0; i < e->n_prefix; i++) ct_ids_push(out, e->prefix[i]);
    int rc = tokenizer_encode(e->tok, text, len, true, out, err);
    for (size_t i = 0; rc == CT_OK && i < e->n_suffix; i++) ct_ids_push(out, e->suffix[i]);
    return rc;
}

static bool space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Spaces at the start (end = false) or the end of a token's string: 'G with a
 * dot' (U+0120, the ByteLevel space) or white space, counted in characters as
 * HF counts them. */
static size_t edge_spaces(const char *s, size_t n, bool end)
{
    size_t count = 0, i = end ? n : 0;
    for (;; count++) {
        if (!end && n - i >= 2 && !memcmp(s + i, "\xC4\xA0", 2)) i += 2;
        else if (!end && i < n && space_char(s[i])) i++;
        else if (end && i >= 2 && !memcmp(s + i - 2, "\xC4\xA0", 2)) i -= 2;
        else if (end && i > 0 && space_char(s[i - 1])) i--;
        else return count;
    }
}

void text_encoder_trim_spans(const ct_text_encoder *e, const ct_ids *ids, ct_spans *spans, size_t first)
{
    if (!e->trim_offsets) return;
    for (size_t i = first; i < spans->len && i < ids->len; i++) {
        size_t n, *s = &spans->data[2 * i], *t = &spans->data[2 * i + 1];
        const char *str = tokenizer_id_to_token(e->tok, ids->data[i], &n);
        if (!str) continue;
        size_t lead = edge_spaces(str, n, false), trail = edge_spaces(str, n, true);
        if (lead && !(e->trim_keeps_first && (i == first || *s == 0))) *s = *s + lead < *t ? *s + lead : *t;
        if (trail && *t >= trail) *t = *t - trail > *s ? *t - trail : *s;
    }
}
