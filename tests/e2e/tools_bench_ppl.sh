#!/bin/sh
# `epyq bench` output schemas (md, csv, json, jsonl share one set of columns) and `epyq ppl`
# (perplexity line, --kld-base save then compare) on tiny synthetic checkpoints.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
BN="bench -m $M -t 1 -p 8 -n 4 -b 1,2 -r 2 --membw-mb 8"
COLS='["model","format","size_gib","params_b","isa","path","threads","numa","test","spec","accept_len","n_prompt","n_ubatch","n_gen","n_batch","n_depth","avg_ts","stddev_ts","gbps","read_gbps","pct_read_bw"]'
expect 0 "bench -o json" "$EPYQ" $BN -o json
jq -e --argjson cols "$COLS" '
  length == 3 and (map(.test) == ["pp8","tg4","tg4 b2"]) and
  all(.[]; (keys_unsorted == $cols) and .avg_ts > 0 and .stddev_ts >= 0 and .threads == 1 and
           .read_gbps > 0 and .gbps > 0 and (.pct_read_bw - 100 * .gbps / .read_gbps | fabs) < 0.05 * .pct_read_bw + 0.01)
' "$T/out" >/dev/null && ok "json schema" || { fail "json schema"; cat "$T/out"; }
expect 0 "bench -o jsonl" "$EPYQ" $BN -o jsonl
jq -e -s --argjson cols "$COLS" 'length == 3 and all(.[]; keys_unsorted == $cols)' "$T/out" >/dev/null &&
    ok "jsonl: one object per line, same columns" || fail "jsonl schema"
expect 0 "bench -o csv" "$EPYQ" $BN -o csv
[ "$(head -1 "$T/out")" = "$(echo "$COLS" | jq -r 'join(",")')" ] && [ "$(wc -l <"$T/out")" = 4 ] &&
    ok "csv header = json columns, 3 rows" || { fail "csv"; cat "$T/out"; }
expect 0 "bench -o md" "$EPYQ" $BN -o md
[ "$(grep -c '^|.*pp8\|^|.*tg4' "$T/out")" = 3 ] && grep -q '^| *model' "$T/out" && ok "markdown table" ||
    { fail "markdown table"; cat "$T/out"; }
expect 2 "bench -o xml" "$EPYQ" $BN -o xml
# -u: the prompt in ubatches (default 512, llama-bench's -ub), 0 = one call; tg rows have none.
expect 0 "bench -u 16" "$EPYQ" bench -m "$M" -t 1 -p 40,8 -n 2 -u 16 -r 1 --membw-mb 8 -o jsonl
jq -e -s '[.[].n_ubatch] == [16, 8, 0] and all(.[]; .avg_ts > 0)' "$T/out" >/dev/null &&
    ok "ubatch column: 16 for pp40, 8 for pp8, 0 for tg" || { fail "ubatch column"; cat "$T/out"; }
expect 0 "bench default ubatch" "$EPYQ" bench -m "$M" -t 1 -p 600 -n 0 -r 1 --membw-mb 8 -o jsonl --no-warmup
jq -e '.n_ubatch == 512' "$T/out" >/dev/null && ok "default ubatch 512" || { fail "default ubatch"; cat "$T/out"; }
expect 0 "bench -u 0" "$EPYQ" bench -m "$M" -t 1 -p 40 -n 0 -u 0 -r 1 --membw-mb 8 -o jsonl
jq -e '.n_ubatch == 40' "$T/out" >/dev/null && ok "-u 0: the whole prompt in one call" || { fail "-u 0"; cat "$T/out"; }
expect 2 "bench -u -1" "$EPYQ" bench -m "$M" -u -1
# -d: every test starts at that depth (llama-bench's "@ dN" names); the spec rows refuse it.
expect 0 "bench -d 24" "$EPYQ" bench -m "$M" -t 1 -p 8 -n 3 -b 1,2 -d 24 -u 16 -r 1 --membw-mb 8 -o jsonl
jq -e -s '[.[].test] == ["pp8 @ d24","tg3 @ d24","tg3 b2 @ d24"] and all(.[]; .n_depth == 24 and .avg_ts > 0)' \
    "$T/out" >/dev/null && ok "depth rows: names and n_depth" || { fail "depth rows"; cat "$T/out"; }
expect 0 "bench without -d" "$EPYQ" bench -m "$M" -t 1 -p 8 -n 0 -r 1 --membw-mb 8 -o jsonl
jq -e '.test == "pp8" and .n_depth == 0' "$T/out" >/dev/null && ok "depth 0 by default" || { fail "depth 0"; cat "$T/out"; }
expect 2 "bench -d with --spec" "$EPYQ" bench -m "$M" -d 8 --spec mtp:2
expect 2 "bench -d -1" "$EPYQ" bench -m "$M" -d -1

# Speculative rows: real drafts, forced acceptance (k + 1 tokens a step) and a projection.
expect 0 "bench --spec" "$EPYQ" bench -m "$M" -t 1 -p 0 -n 8 -r 1 --membw-mb 8 -o jsonl \
    --spec none,mtp:2,mtp:2:forced --accept 0.9,0.8
jq -e -s '[.[].spec] == ["none","mtp:2","mtp:2:forced","mtp:2@0.90,0.80"] and .[2].accept_len == 3 and
          (.[3].accept_len - 2.7 | fabs) < 1e-6 and .[1].accept_len >= 1 and all(.[]; .avg_ts > 0)' "$T/out" >/dev/null &&
    ok "spec rows: none, real, forced, projected" || { fail "spec rows"; cat "$T/out"; }
expect 2 "bench --spec mtp:9" "$EPYQ" bench -m "$M" --spec mtp:9
# Numeric paths, switched on one loaded model: a row each, named in the path column.
expect 0 "bench --path a16,a8,a8all" "$EPYQ" bench -m "$M" -t 1 -p 8 -n 0 -r 1 --membw-mb 8 -o jsonl \
    --path a16,a8,a8all
jq -e -s '[.[].path] == ["a16","a8","a8all"] and all(.[]; .avg_ts > 0)' "$T/out" >/dev/null &&
    ok "path rows: a16, a8, a8all" || { fail "path rows"; cat "$T/out"; }
expect 2 "bench --path a4" "$EPYQ" bench -m "$M" --path a16,a4
grep -q "expected a list of a16, a8, a8all" "$T/err" || fail "bench --path a4: message"
expect 2 "run --path a4" "$EPYQ" run -m "$M" --path a4 -p hi
grep -q "expected a16, a8 or a8all, got 'a4'" "$T/err" || fail "run --path a4: message" 
expect 2 "bench --spec bogus" "$EPYQ" bench -m "$M" --spec eagle

# Perplexity: 12 lines of text, window 32 (stride 16).
i=0; while [ $i -lt 12 ]; do echo "The quick brown fox jumps over the lazy dog, time $i."; i=$((i + 1)); done >"$T/text.txt"
P="ppl -t 1 -f $T/text.txt -c 32"
expect 0 "ppl" "$EPYQ" $P -m "$M" --kld-base "$T/base.kld"
grep -Eq '^PPL = [0-9.]+ \+/- [0-9.]+' "$T/out" && ok "PPL line with its standard error" || { fail "PPL line"; cat "$T/out"; }
grep -Eq 'tokens/s' "$T/out" || fail "ppl: no tokens/s"
[ -s "$T/base.kld" ] && ok "--kld-base saved the distributions" || fail "--kld-base wrote nothing"
ppl1=$(grep '^PPL' "$T/out")
expect 0 "ppl compare, same model" "$EPYQ" $P -m "$M" --kld-base "$T/base.kld"
[ "$(grep '^PPL' "$T/out")" = "$ppl1" ] || fail "ppl is not reproducible"
grep -Eq 'KL divergence .* mean [0-9.e-]+, max [0-9.e-]+ nats; top-1 agreement [0-9.]+%' "$T/out" &&
    ok "KL line" || { fail "KL line"; cat "$T/out"; }
# a8all: the int4 projections outside the experts take int8 activations too, so the
# distributions move a little from a8's (the base), and only a little.
expect 0 "ppl --path a8all compared with a8" "$EPYQ" $P -m "$M" --path a8all --kld-base "$T/base.kld"
kl=$(sed -n 's/.*mean \([0-9.e-]*\),.*/\1/p' "$T/out")
awk -v k="$kl" 'BEGIN { exit !(k > 0 && k < 0.01) }' && ok "a8all vs a8: KL mean $kl" || { fail "a8all KL '$kl'"; cat "$T/out"; }
# Another checkpoint (same shape and tokenizer, other weights) must disagree clearly.
"$EPYQ" synth -o "$T/other" --shape tiny --format ct -s 5 -t 1 >/dev/null 2>&1 || fail "synth -s 5"
expect 0 "ppl compare, other weights" "$EPYQ" $P -m "$T/other" --kld-base "$T/base.kld"
kl=$(sed -n 's/.*mean \([0-9.e-]*\),.*/\1/p' "$T/out")
awk -v k="$kl" 'BEGIN { exit !(k > 0.01) }' && ok "other weights: KL mean $kl" || { fail "other weights KL '$kl'"; cat "$T/out"; }
printf 'not a kld file' >"$T/bad.kld"
expect 1 "ppl with a corrupt --kld-base" "$EPYQ" $P -m "$M" --kld-base "$T/bad.kld"
finish
