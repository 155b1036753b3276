#!/bin/sh
# benchmarks/prefix_cache.sh — prefix reuse (issue 15): N completion requests sharing a
# ~1k-token system prompt (each with a short text of its own) through `epyq batch`, with the
# prefix cache off (--cache-mb 0) and on (the default), alternating R times. Prints the wall
# time of each run (model load included), batch's summary line (prompt tokens computed and
# cached, cache entries and bytes), and whether the records are equal apart from
# usage.prompt_tokens_details (they must be).
#   sh benchmarks/prefix_cache.sh -m DIR [-n 64] [-r 1] [-t 2] [-b 8] [-e 256]
set -u
EPYQ=${EPYQ_BIN:-$PWD/epyq}
M= N=64 R=1 TH=2 MB=8 EV=256
while [ $# -gt 0 ]; do
    case $1 in
    -m) M=$2; shift 2;; -n) N=$2; shift 2;; -r) R=$2; shift 2;; -t) TH=$2; shift 2;;
    -b) MB=$2; shift 2;; -e) EV=$2; shift 2;;
    *) echo "usage: $0 -m DIR [-n N] [-r REPS] [-t THREADS] [-b MAX_BATCH] [-e CACHE_EVERY]"; exit 2;;
    esac
done
[ -n "$M" ] || { echo "usage: $0 -m DIR ..."; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
sys=$(printf 'rule %d, ' $(seq 1 140))
printf '%s' "$sys" | "$EPYQ" tokenize -m "$M" 2>/dev/null | tr ',' '\n' | wc -l | sed 's/^/shared prompt tokens: /'
i=0
while [ $i -lt "$N" ]; do
    printf '{"custom_id":"q%d","method":"POST","url":"/v1/completions","body":{"prompt":"%s question %d about item %d?","max_tokens":16,"seed":%d}}\n' \
        $i "$sys" $i $((i * 7)) $i
    i=$((i + 1))
done >"$T/in.jsonl"
r=0
while [ $r -lt "$R" ]; do
    for c in 0 1024; do
        rm -f "$T/out$c.jsonl"
        s=$(date +%s.%N)
        "$EPYQ" batch -m "$M" -t "$TH" -c 2048 --max-batch "$MB" --cache-mb $c --cache-every "$EV" \
            -i "$T/in.jsonl" -o "$T/out$c.jsonl" 2>"$T/err" || { tail -3 "$T/err"; exit 1; }
        e=$(date +%s.%N)
        echo "--cache-mb $c: $(echo "$e - $s" | bc) s; $(tail -1 "$T/err")"
    done
    r=$((r + 1))
done
S='del(.[].response.body.usage.prompt_tokens_details)'
[ "$(jq -c -s "$S" "$T/out0.jsonl")" = "$(jq -c -s "$S" "$T/out1024.jsonl")" ] && echo "records equal with and without the cache" ||
    { echo "records DIFFER"; exit 1; }
