#!/usr/bin/env bash
# Makes sure the build dependencies (a C compiler, libyaml, zlib, PCRE2 and
# utf8proc for the tokenizer) are present.
# As root on Debian/Ubuntu it installs what is missing; otherwise it names the
# exact command to run and fails.
set -u
missing=()
command -v "${CC:-gcc}" >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
[ -f /usr/include/yaml.h ] || missing+=(libyaml-dev)
[ -f /usr/include/zlib.h ] || missing+=(zlib1g-dev)
[ -f /usr/include/pcre2.h ] || missing+=(libpcre2-dev)
[ -f /usr/include/utf8proc.h ] || missing+=(libutf8proc-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing build dependencies: ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null && exit 0
    echo "error: apt-get could not install ${missing[*]}" >&2
    exit 2
fi
echo "error: missing build dependencies: ${missing[*]}" >&2
echo "HINT: run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
exit 2
