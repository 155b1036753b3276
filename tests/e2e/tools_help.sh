#!/bin/sh
# Every subcommand answers --help with status 0 and text on stdout; usage errors exit 2 with
# one line; a missing model is a runtime failure (exit 1, "epyq: ...").
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
for c in inspect synth logits tokenize detokenize template run chat batch bench ppl; do
    expect 0 "$c --help" "$EPYQ" "$c" --help
    grep -q "usage" "$T/out" || fail "$c --help prints no usage"
done
expect 0 "epyq --help" "$EPYQ" --help
for c in run chat batch bench ppl; do
    expect 2 "$c --no-such-option" "$EPYQ" "$c" --no-such-option
    [ "$(wc -l <"$T/err")" = 1 ] || fail "$c usage error is not one line"
done
expect 2 "run without -m" "$EPYQ" run -p hi
expect 2 "chat with -m and --synthetic" "$EPYQ" chat -m x --synthetic tiny
expect 1 "run with a missing folder" "$EPYQ" run -m "$T/none" -p hi
grep -q '^epyq: ' "$T/err" || fail "runtime failure message does not start with 'epyq: '"
finish
