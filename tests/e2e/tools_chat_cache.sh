#!/bin/sh
# `epyq chat` prompt reuse across turns and runs (issue 15), piped, greedy, on the tiny model
# with the real Qwen template (which drops old reasoning, so a turn's prompt parts from what
# the sequence was fed where the last answer began):
#   - thinking on and off: the conversation (every answer) is the same with the cache off and
#     on; the second turn computes only what follows the first prompt's history, and at most
#     (its new tokens + the checkpoint spacing) by the issue's measure; /regen computes one
#     token; after /clear the system prompt is restored; with --cache-mb 0 all is recomputed;
#   - --session FILE: a second run continues the first one's conversation with the answers of
#     one uninterrupted run, computing only the new message;
#   - at a 1 MB budget copies are evicted, the answers are the same and the cache stays within;
#   - truncated, corrupt and foreign session files are refused in one line naming the file and
#     the field, and a refused /load keeps the conversation.
# The expected token counts come from `epyq template --ids` (the template and tokenizer alone),
# not from chat's own bookkeeping.
command -v jq >/dev/null 2>&1 || { echo "jq missing: skipped"; exit 77; }
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
SYS="You answer in one short line."
chat() { "$EPYQ" chat -m "$M" -t 1 -n 24 --temp 0 --system "$SYS" "$@"; }
# n_ids JSON-MESSAGES GEN-PROMPT THINK: prompt length of a rendering
ids() {
    printf '{"messages": %s, "kwargs": {"add_generation_prompt": %s, "enable_thinking": %s}}' "$1" "$2" "$3" |
        "$EPYQ" template -m "$M" -i - --ids
}
n_ids() { ids "$@" | jq length; }
# common prefix length of two id arrays
lcp() { jq -n --argjson a "$1" --argjson b "$2" \
    '[range(0; [($a|length), ($b|length)] | min) | select($a[.] != $b[.])] | (first // ([($a|length), ($b|length)] | min))'; }
# the Nth answer stats line's computed / cached counts
computed() { sed -n 's/^\[ prompt \([0-9]*\) computed + [0-9]* cached.*/\1/p' "$1" | sed -n "$2p"; }
cached() { sed -n 's/^\[ prompt [0-9]* computed + \([0-9]*\) cached.*/\1/p' "$1" | sed -n "$2p"; }

for think in true false; do
    flag=; [ $think = false ] && flag=--no-think
    in=$(printf 'Hello\nMore please\n/save %s/c.json\n/regen\n/save %s/r.json\n/clear\nGood morning\n/save %s/h.json\n' "$T" "$T" "$T")
    printf '%s\n' "$in" | chat $flag --cache-mb 0 >"$T/o0" 2>"$T/e0" || fail "think $think: chat, cache off"
    for f in c r h; do mv "$T/$f.json" "$T/${f}0.json"; done
    printf '%s\n' "$in" | chat $flag >"$T/o1" 2>"$T/e1" || fail "think $think: chat, cache on"
    for f in c r h; do
        cmp -s "$T/${f}0.json" "$T/$f.json" && ok "think $think: /save $f: same conversation with the cache on" ||
            { fail "think $think: /save $f differs with the cache on"; diff "$T/${f}0.json" "$T/$f.json" | head -5; }
    done
    [ "$(jq '.messages | length' "$T/c.json")" = 5 ] || fail "think $think: expected 5 messages"
    m=$(jq -c '.messages' "$T/c.json")
    p1=$(ids "$(printf '%s' "$m" | jq -c '.[0:2]')" true $think)
    p2=$(ids "$(printf '%s' "$m" | jq -c '.[0:4]')" true $think)
    hist1=$(n_ids "$(printf '%s' "$m" | jq -c '.[0:2]')" false $think)
    len2=$(printf '%s' "$p2" | jq length) shared=$(lcp "$p1" "$p2")
    c2=$(computed "$T/e1" 2) k2=$(cached "$T/e1" 2)
    [ "$c2" -eq $((len2 - hist1)) ] && [ "$k2" -eq "$hist1" ] &&
        ok "think $think: turn 2 computed $c2 of $len2 (restored $k2 = the first prompt's history)" ||
        fail "think $think: turn 2 computed '$c2' + cached '$k2', expected $((len2 - hist1)) + $hist1"
    [ "$c2" -le $((len2 - shared + 256)) ] || fail "think $think: turn 2 computed $c2 > new tokens $((len2 - shared)) + 256"
    [ "$(computed "$T/e0" 2)" = "$len2" ] && [ "$(cached "$T/e0" 2)" = 0 ] ||
        fail "think $think: cache off: turn 2 should compute all $len2 tokens"
    [ "$(computed "$T/e1" 3)" = 1 ] && [ "$(cached "$T/e1" 3)" = $((len2 - 1)) ] &&
        ok "think $think: /regen computed 1 token" || fail "think $think: /regen computed '$(computed "$T/e1" 3)'"
    # after /clear, another first message: restored up to where its text begins
    sysk=$(($(n_ids "$(jq -nc --arg s "$SYS" '[{role: "system", content: $s}, {role: "user", content: ""}]')" false $think) - 2))
    [ "$(cached "$T/e1" 4)" = "$sysk" ] && ok "think $think: after /clear the system prompt ($sysk tokens) was restored" ||
        fail "think $think: after /clear cached '$(cached "$T/e1" 4)', expected $sysk"
    cp "$T/c.json" "$T/c_$think.json"
done

# at the budget: a cache of 1 MB holds four copies of these prompts (~0.23 MB each), so the
# second turn evicts one; the answers stay those of the cache off, the cache within its budget
printf 'Hello\nMore please\n/save %s/b.json\n/stats\n' "$T" | chat --cache-mb 1 >"$T/ob" 2>"$T/eb" || fail "chat --cache-mb 1"
[ "$(jq -c '.messages' "$T/b.json")" = "$(jq -c '.messages' "$T/c_true.json")" ] && ok "--cache-mb 1: the same answers" ||
    fail "--cache-mb 1: other answers"
sed -n 's/^cache *[0-9]* copies, \([0-9.]*\) of \([0-9]*\) MiB.*/\1 \2/p' "$T/ob" | awk '{ exit !($1 <= $2 && $2 == 1) }' &&
    grep -q '^cache .* [1-9][0-9]* evicted$' "$T/ob" &&
    ok "--cache-mb 1: evicted, within the budget" || fail "--cache-mb 1: $(grep '^cache' "$T/ob")"

# --session: run 1 answers, run 2 continues from the file; together they give the answers of
# one run (c_true.json), and run 2 computes only the new message.
printf 'Hello\n' | chat --session "$T/s.bin" >/dev/null 2>"$T/es1" || fail "chat --session (first run)"
[ "$(head -c 8 "$T/s.bin")" = EPYQSESS ] && ok "--session wrote a session file" || fail "no session file"
printf 'More please\n/save %s/s2.json\n' "$T" | chat --session "$T/s.bin" >/dev/null 2>"$T/es2" ||
    fail "chat --session (second run)"
cmp -s "$T/s2.json" "$T/c_true.json" && ok "--session: the same answers as one uninterrupted run" ||
    { fail "--session: the conversation differs from one run's"; diff "$T/s2.json" "$T/c_true.json" | head; }
m=$(jq -c '.messages' "$T/c_true.json")
len2=$(n_ids "$(printf '%s' "$m" | jq -c '.[0:4]')" true true)
base=$(($(n_ids "$(printf '%s' "$m" | jq -c '.[0:3] + [{role: "user", content: ""}]')" false true) - 2))
[ "$(computed "$T/es2" 1)" = $((len2 - base)) ] && [ "$(cached "$T/es2" 1)" = "$base" ] &&
    ok "--session: the next turn computed $((len2 - base)) of $len2 tokens" ||
    fail "--session: computed '$(computed "$T/es2" 1)' + cached '$(cached "$T/es2" 1)', expected $((len2 - base)) + $base"
# /save and /load of a session in one run give the same
printf 'Hello\n/save %s/s3.bin\n' "$T" | chat >/dev/null 2>&1
printf '/load %s/s3.bin\nMore please\n/save %s/s3.json\n' "$T" "$T" | chat >/dev/null 2>"$T/es3"
cmp -s "$T/s3.json" "$T/c_true.json" && ok "/save, /load: the same answers" || fail "/load of a session: other answers"

# refusals: one line on stderr naming the file and the field; --session exits 1
refuse() { # DESC FILE FIELD [chat options]
    d=$1 f=$2 field=$3; shift 3
    chat --session "$f" "$@" </dev/null >/dev/null 2>"$T/eref"; rc=$?
    line=$(grep '^epyq: ' "$T/eref")
    [ $rc = 1 ] && [ "$(printf '%s\n' "$line" | wc -l)" = 1 ] && printf '%s' "$line" | grep -qF "$f: $field" &&
        ok "refused: $d" || { fail "$d: exit $rc, message '$line' (expected '$f: $field')"; }
}
good=$T/s.bin size=$(wc -c <"$good")
head -c 40 "$good" >"$T/t1.bin"; refuse "shorter than the header" "$T/t1.bin" size
head -c $((size / 2)) "$good" >"$T/t2.bin"; refuse "truncated to half" "$T/t2.bin" size
head -c $((size - 1)) "$good" >"$T/t3.bin"; refuse "one byte short" "$T/t3.bin" size
flip() { cp "$good" "$2"; printf '\377' | dd of="$2" bs=1 seek="$1" conv=notrunc 2>/dev/null; }
flip 3 "$T/f1.bin"; refuse "magic" "$T/f1.bin" magic
flip 20 "$T/f2.bin"; refuse "a flipped header byte" "$T/f2.bin" "header checksum"
flip $((size - 100)) "$T/f3.bin"; refuse "a flipped state byte" "$T/f3.bin" "body checksum"
refuse "another context" "$good" context -c 2048
refuse "another KV type" "$good" "KV type" --kv-type fp8
"$EPYQ" synth -o "$T/other" --shape tiny --format ct -t 1 -s 7 >/dev/null 2>&1 || fail "synth other"
"$EPYQ" chat -m "$T/other" -t 1 -n 4 --session "$good" </dev/null >/dev/null 2>"$T/eref"
grep -qF "$good: model identity" "$T/eref" && ok "refused: another model of the same shape" ||
    fail "another model: $(cat "$T/eref" | tail -1)"
# a refused /load keeps the conversation
printf 'Hello\n/load %s\n/save %s/kept.json\n' "$T/f3.bin" "$T" | chat >/dev/null 2>"$T/eref"
[ "$(jq '.messages | length' "$T/kept.json")" = 3 ] && grep -q "f3.bin: body checksum" "$T/eref" &&
    ok "a refused /load keeps the conversation" || fail "refused /load changed the conversation"
finish
