/* test_text_match.c — the match rules of `ctune eval --generate` (text_match.h):
 * trimming as Python's str.strip(), exact against contains, UTF-8 white space,
 * ill-formed bytes, empty strings and NUL bytes. */
#include "check.h"
#include "text_match.h"

#define S(lit) (lit), (sizeof(lit) - 1)

static bool exact(const char *g, size_t gn, const char *r, size_t rn)
{
    return text_match(TEXT_MATCH_EXACT, g, gn, r, rn);
}
static bool contains(const char *g, size_t gn, const char *r, size_t rn)
{
    return text_match(TEXT_MATCH_CONTAINS, g, gn, r, rn);
}

TEST(strip_removes_ascii_white_space_at_both_ends_only)
{
    size_t s, e;
    text_strip(S(" \t\r\n\v\f a b \n"), &s, &e);
    CHECK(s == 7 && e == 10, "got [%zu, %zu)", s, e);
    text_strip(S("ab"), &s, &e);
    CHECK(s == 0 && e == 2, "got [%zu, %zu)", s, e);
    CHECK(text_rstrip(S("a b  \n")) == 3, "rstrip keeps inner spaces");
}

TEST(strip_removes_unicode_white_space_as_python_does)
{
    size_t s, e;
    /* U+3000 ideographic space, U+00A0 no-break space, U+2028 line separator, U+0085 next line */
    text_strip(S("\xE3\x80\x80\xC2\xA0x\xE2\x80\xA8\xC2\x85"), &s, &e);
    CHECK(s == 5 && e == 6, "got [%zu, %zu)", s, e);
    /* the file separators 0x1c-0x1f are white space to Python */
    text_strip(S("\x1cx\x1f"), &s, &e);
    CHECK(s == 1 && e == 2, "got [%zu, %zu)", s, e);
    /* U+200B zero width space is not (Python: '\u200b'.isspace() is False) */
    text_strip(S("\xE2\x80\x8Bx"), &s, &e);
    CHECK(s == 0 && e == 4, "got [%zu, %zu)", s, e);
}

TEST(strip_treats_ill_formed_bytes_as_text)
{
    size_t s, e;
    /* a lone continuation byte, a cut-off U+3000 and an overlong space (C0 A0) are not white space */
    text_strip(S("\x80 x \xE3\x80"), &s, &e);
    CHECK(s == 0 && e == 6, "got [%zu, %zu)", s, e);
    text_strip(S("\xC0\xA0x\xC0\xA0"), &s, &e);
    CHECK(s == 0 && e == 5, "got [%zu, %zu)", s, e);
    /* a U+3000 cut at the end of the buffer is not read past n */
    CHECK(text_rstrip("x\xE3\x80\x80", 3) == 3, "the cut sequence stays");
    text_strip("\xE3\x80\x80", 2, &s, &e);
    CHECK(s == 0 && e == 2, "got [%zu, %zu)", s, e);
}

TEST(strip_of_empty_and_all_white_space_is_empty)
{
    size_t s = 9, e = 9;
    text_strip("", 0, &s, &e);
    CHECK(s == 0 && e == 0, "got [%zu, %zu)", s, e);
    text_strip(S(" \n\xE3\x80\x80 "), &s, &e);
    CHECK(s == e, "got [%zu, %zu)", s, e);
    CHECK(text_rstrip(S(" \t")) == 0, "all white space");
}

TEST(exact_ignores_white_space_at_the_ends_but_not_inside)
{
    CHECK(exact(S("  42\n"), S("42")), "trimmed equal");
    CHECK(exact(S("42"), S("\t42 ")), "the reference is trimmed too");
    CHECK(!exact(S("4 2"), S("42")), "inner space counts");
    CHECK(!exact(S("42."), S("42")), "a longer generation is not exact");
    CHECK(!exact(S("Paris"), S("paris")), "case counts");
}

TEST(contains_finds_the_trimmed_reference_anywhere)
{
    CHECK(contains(S("The answer is 42."), S(" 42\n")), "inside");
    CHECK(contains(S("42"), S("42")), "the whole of it");
    CHECK(!contains(S("The answer is 4 2."), S("42")), "not split");
    CHECK(!contains(S("42"), S("The answer is 42")), "the reference must be the shorter");
    /* exact is the stricter: a containing generation is not exact */
    CHECK(!exact(S("The answer is 42."), S("42")), "contains is not exact");
}

TEST(matching_compares_utf8_bytes)
{
    CHECK(exact(S("\xE3\x80\x80" "caf\xC3\xA9\xE3\x80\x80"), S("caf\xC3\xA9")), "café between ideographic spaces");
    CHECK(!exact(S("cafe\xCC\x81"), S("caf\xC3\xA9")), "no Unicode normalization: e + U+0301 is not é");
    CHECK(contains(S("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"), S("\xE6\x9C\xAC")), "one CJK character inside");
    CHECK(exact(S("\xFF\xFE"), S("\xFF\xFE")), "ill-formed bytes compare as bytes");
}

TEST(empty_strings)
{
    CHECK(exact("", 0, "", 0), "empty equals empty");
    CHECK(exact(S(" \n"), "", 0), "all white space is empty once trimmed");
    CHECK(!exact(S("x"), "", 0), "something is not empty");
    CHECK(!exact("", 0, S("x")), "an empty generation does not equal a reference");
    CHECK(contains(S("x"), S("  ")), "an empty reference is contained in anything");
    CHECK(!contains("", 0, S("x")), "an empty generation contains no reference");
}

TEST(nul_bytes_are_text)
{
    CHECK(!exact(S("a\0b"), S("a")), "a NUL does not end the generation");
    CHECK(contains(S("x\0yz"), S("yz")), "found after a NUL");
    CHECK(exact(S("a\0b "), S("a\0b")), "equal with the NUL");
}

TEST(metric_names_parse_and_unknown_ones_are_named)
{
    text_match_metric m = TEXT_MATCH_EXACT;
    ct_error err = {0};
    CHECK(text_match_metric_parse("contains", &m, &err) == CT_OK && m == TEXT_MATCH_CONTAINS, "contains");
    CHECK(text_match_metric_parse("exact", &m, &err) == CT_OK && m == TEXT_MATCH_EXACT, "exact");
    CHECK(text_match_metric_parse("fuzzy", &m, &err) == CT_ERR_INPUT, "fuzzy is refused");
    CHECK(strstr(err.msg, "--metric 'fuzzy': expected exact or contains") != NULL, "got '%s'", err.msg);
}

int main(void)
{
    RUN(strip_removes_ascii_white_space_at_both_ends_only);
    RUN(strip_removes_unicode_white_space_as_python_does);
    RUN(strip_treats_ill_formed_bytes_as_text);
    RUN(strip_of_empty_and_all_white_space_is_empty);
    RUN(exact_ignores_white_space_at_the_ends_but_not_inside);
    RUN(contains_finds_the_trimmed_reference_anywhere);
    RUN(matching_compares_utf8_bytes);
    RUN(empty_strings);
    RUN(nul_bytes_are_text);
    RUN(metric_names_parse_and_unknown_ones_are_named);
    return check_summary();
}
