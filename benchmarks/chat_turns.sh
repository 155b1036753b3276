#!/bin/sh
# benchmarks/chat_turns.sh — prompt reuse across `epyq chat` turns (issue 15): a first user
# message of ITEMS list items (about 6 tokens each) answered with up to N tokens, then a short
# second message, greedy, piped; once with the prefix cache off (--cache-mb 0) and once on.
# Prints each turn's answer line (prompt tokens computed + cached, time to first token) and
# /stats' prompt and cache lines, and whether both runs gave the same answers (they must).
# A third run saves a session after turn 1 (--session) and a fourth continues from it.
#   sh benchmarks/chat_turns.sh -m DIR [-i ITEMS] [-n N] [-t THREADS] [-e CACHE_EVERY] [-c CTX] [--no-think]
set -u
EPYQ=${EPYQ_BIN:-$PWD/epyq}
M= ITEMS=600 N=300 TH=2 EV=256 THINK= CTX=8192
while [ $# -gt 0 ]; do
    case $1 in
    -m) M=$2; shift 2;; -i) ITEMS=$2; shift 2;; -n) N=$2; shift 2;; -t) TH=$2; shift 2;;
    -e) EV=$2; shift 2;; -c) CTX=$2; shift 2;; --no-think) THINK=--no-think; shift;;
    *) echo "usage: $0 -m DIR [-i ITEMS] [-n N] [-t THREADS] [-e CACHE_EVERY] [-c CTX] [--no-think]"; exit 2;;
    esac
done
[ -n "$M" ] || { echo "usage: $0 -m DIR ..."; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
first="Here is a list: $(seq 1 "$ITEMS" | sed 's/^/item /' | tr '\n' ' ')Which item comes after item 17?"
second="And which one comes before it?"
run() { # NAME CHAT-OPTIONS...: the two turns, /save, /stats
    name=$1; shift
    printf '%s\n/stats\n%s\n/save %s\n/stats\n' "$first" "$second" "$T/$name.json" |
        "$EPYQ" chat -m "$M" -t "$TH" -c "$CTX" -n "$N" --temp 0 $THINK --cache-every "$EV" "$@" >"$T/$name.out" 2>"$T/$name.err" ||
        { tail -3 "$T/$name.err"; exit 1; }
    echo "== $name ($*)"
    grep '^\[ prompt' "$T/$name.err" | sed 's/^/  turn: /'
    grep '^prompt \|^cache \|^last answer' "$T/$name.out" | sed 's/^/  /'
}
run off --cache-mb 0
run on --cache-mb 1024
S='del(.enable_thinking)'
[ "$(jq -c "$S" "$T/off.json")" = "$(jq -c "$S" "$T/on.json")" ] && echo "answers equal with and without the cache" ||
    { echo "answers DIFFER"; exit 1; }
# across runs: turn 1 saved to a session (the save also computes the answer as the history
# renders it), turn 2 in a new process
printf '%s\n' "$first" | "$EPYQ" chat -m "$M" -t "$TH" -c "$CTX" -n "$N" --temp 0 $THINK --session "$T/s.bin" \
    >/dev/null 2>"$T/s1.err" || { tail -3 "$T/s1.err"; exit 1; }
s=$(date +%s.%N)
printf '%s\n/save %s\n/stats\n' "$second" "$T/sess.json" |
    "$EPYQ" chat -m "$M" -t "$TH" -c "$CTX" -n "$N" --temp 0 $THINK --session "$T/s.bin" >"$T/s2.out" 2>"$T/s2.err" ||
    { tail -3 "$T/s2.err"; exit 1; }
e=$(date +%s.%N)
echo "== session: $(wc -c <"$T/s.bin") bytes; second run $(echo "$e - $s" | bc) s (model load included)"
grep '^\[ prompt' "$T/s2.err" | sed 's/^/  turn: /'
[ "$(jq -c "$S" "$T/off.json")" = "$(jq -c "$S" "$T/sess.json")" ] && echo "answers equal across runs" ||
    { echo "answers DIFFER across runs"; exit 1; }
