#!/bin/sh
# Issue 13: contexts, loading and runtime flags in run / chat / batch on a tiny synthetic checkpoint
# (max_position_embeddings 4096): a prompt one token past -c is refused with the counts, a -c
# above the model's context is refused naming both numbers (no silent clamp), --kv-type and
# the NUMA flags / EPYQ_NUMA* variables are taken by all three and the KV memory is reported,
# a 262,144-token context is allocated when the config allows it (and more under YaRN), and a
# load that cannot fit in memory is refused before it starts.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
P="The quick brown fox"
N=$(printf '%s' "$P" | "$EPYQ" tokenize -m "$M" | jq length)
[ "$N" -gt 2 ] || fail "tokenize: $N tokens"
R="run -m $M -t 1 -n 4 --temp 0"

# one token past the context, then exactly the context
expect 1 "run: prompt one token past -c" "$EPYQ" $R -c $((N - 1)) -p "$P"
grep -q "^epyq: prompt has $N tokens, context is $((N - 1)) (-c): 1 too many$" "$T/err" ||
    fail "run: the refusal does not give both counts: $(cat "$T/err")"
expect 0 "run: prompt as long as -c" "$EPYQ" $R -c "$N" -p "$P"

# -c above max_position_embeddings: refused by run, chat and batch, before loading
expect 1 "run -c 4097" "$EPYQ" $R -c 4097 -p "$P"
grep -q '^epyq: -c 4097: .*4096' "$T/err" || fail "run -c 4097: message lacks both numbers: $(cat "$T/err")"
grep -q model_loaded "$T/err" && fail "run -c 4097: the weights were loaded before refusing"
printf 'Hello\n' >"$T/in"
"$EPYQ" chat -m "$M" -t 1 -n 4 -c 5000 <"$T/in" >"$T/out" 2>"$T/err"
[ $? = 1 ] && grep -q '^epyq: -c 5000: .*4096' "$T/err" && ok "chat -c 5000 refused" || fail "chat -c 5000: $(cat "$T/err")"
printf '{"custom_id":"a","prompt":"Hi","max_tokens":3}\n' >"$T/b.jsonl"
expect 1 "batch -c 4097" "$EPYQ" batch -m "$M" -t 1 -i "$T/b.jsonl" -o "$T/b.out" -c 4097
grep -q '^epyq: -c 4097: .*4096' "$T/err" || fail "batch -c 4097: $(cat "$T/err")"
# defaults are capped, not refused (chat 8192, batch 4096)
expect 0 "chat with its default context" sh -c "'$EPYQ' chat -m '$M' -t 1 -n 4 --temp 0 <'$T/in'"
grep '^{"event":"context"' "$T/err" | jq -e '.n_ctx == 4096 and .kv_type == "bf16"' >/dev/null ||
    fail "chat: no context line with 4096 tokens"

# --kv-type: fp8 halves the KV bytes, in all three tools
expect 0 "run --kv-type bf16" "$EPYQ" $R -c 1024 -p "$P" --kv-type bf16
KB=$(grep '^{"event":"context"' "$T/err" | jq .kv_bytes)
expect 0 "run --kv-type fp8" "$EPYQ" $R -c 1024 -p "$P" --kv-type fp8
KF=$(grep '^{"event":"context"' "$T/err" | jq .kv_bytes)
[ "$KB" -gt 0 ] && [ "$KB" = $((KF * 2)) ] && ok "fp8 KV is half of bf16 ($KF vs $KB bytes)" || fail "KV bytes bf16 $KB fp8 $KF"
expect 0 "chat --kv-type fp8" sh -c "'$EPYQ' chat -m '$M' -t 1 -n 4 -c 512 --kv-type fp8 <'$T/in'"
grep '^{"event":"context"' "$T/err" | jq -e '.kv_type == "fp8" and .n_ctx == 512' >/dev/null || fail "chat: no fp8 context line"
expect 0 "batch --kv-type fp8" "$EPYQ" batch -m "$M" -t 1 -i "$T/b.jsonl" -o "$T/b1.out" --kv-type fp8 --max-batch 2
grep '^{"event":"context"' "$T/err" | jq -e '.kv_type == "fp8" and .sequences == 2' >/dev/null || fail "batch: no fp8 context line"
expect 2 "run --kv-type fp4" "$EPYQ" $R -p "$P" --kv-type fp4
grep -q 'fp4' "$T/err" || fail "--kv-type fp4: message does not name the value"

# NUMA: flags and variables in all three tools; the split run gives the same greedy text
expect 0 "run, one pool" "$EPYQ" run -m "$M" -t 2 -n 8 --temp 0 -p "$P"
cp "$T/out" "$T/plain"
expect 0 "run --numa-split 2" "$EPYQ" run -m "$M" -t 2 -n 8 --temp 0 -p "$P" --numa-split 2
cmp -s "$T/out" "$T/plain" && ok "run --numa-split 2: same text" || fail "run --numa-split 2 changed the text"
expect 0 "run EPYQ_NUMA_SPLIT=2" env EPYQ_NUMA_SPLIT=2 "$EPYQ" run -m "$M" -t 2 -n 8 --temp 0 -p "$P"
cmp -s "$T/out" "$T/plain" || fail "EPYQ_NUMA_SPLIT=2 changed the text"
expect 1 "run EPYQ_NUMA_SPLIT=2 -t 1 (the plan is used: too few threads)" env EPYQ_NUMA_SPLIT=2 "$EPYQ" run -m "$M" -t 1 -n 2 -p "$P"
expect 2 "run EPYQ_NUMA=sideways" env EPYQ_NUMA=sideways "$EPYQ" $R -p "$P"
grep -q 'EPYQ_NUMA.*sideways' "$T/err" || fail "EPYQ_NUMA=sideways: $(cat "$T/err")"
expect 2 "chat --numa sideways" "$EPYQ" chat -m "$M" --numa sideways
expect 0 "chat --numa-split 2" sh -c "'$EPYQ' chat -m '$M' -t 2 -n 4 --numa-split 2 --numa distribute <'$T/in'"
expect 0 "batch --numa-split 2" "$EPYQ" batch -m "$M" -t 2 -i "$T/b.jsonl" -o "$T/b2.out" --numa-split 2
expect 0 "batch EPYQ_NUMA=off" env EPYQ_NUMA=off "$EPYQ" batch -m "$M" -t 1 -i "$T/b.jsonl" -o "$T/b3.out"
for c in run chat batch; do
    "$EPYQ" $c --help >"$T/out" 2>&1
    grep -q -- '--kv-type' "$T/out" && grep -q -- '--numa-split' "$T/out" || fail "$c --help lacks --kv-type / --numa-split"
done

# A 262,144-token context (Qwen's native one) on the tiny model with that
# max_position_embeddings: allocated, reported, and one token generated.
L="$T/long"
cp -r "$M" "$L"
sed -i 's/"max_position_embeddings": *4096/"max_position_embeddings": 262144/' "$L/config.json"
expect 0 "run -c 262144" "$EPYQ" run -m "$L" -t 1 -n 2 --temp 0 -c 262144 -p "$P"
grep '^{"event":"context"' "$T/err" | jq -e '.n_ctx == 262144 and .kv_bytes > 0' >/dev/null &&
    ok "262144-token context: $(grep '^{"event":"context"' "$T/err" | jq .kv_bytes) KV bytes" || fail "no 262144 context line"
expect 1 "run -c 262145" "$EPYQ" run -m "$L" -t 1 -n 2 -c 262145 -p "$P"

# loading: refused before it starts when it cannot fit, with the numbers; the load line
# reports its throughput
expect 1 "run with 1 MB available" env EPYQ_MEM_AVAILABLE=1000000 "$EPYQ" $R -p "$P"
grep -q "^epyq: $M: the model needs .* MiB of memory .* but 1.0 MiB is available (EPYQ_MEM_AVAILABLE); nothing was loaded$" "$T/err" ||
    fail "memory refusal: $(cat "$T/err")"
grep -q model_loaded "$T/err" && fail "memory refusal came after the load"
expect 1 "batch with 1 MB available" env EPYQ_MEM_AVAILABLE=1000000 "$EPYQ" batch -m "$M" -t 1 -i "$T/b.jsonl" -o "$T/b4.out"
grep -q 'nothing was loaded' "$T/err" || fail "batch: no memory refusal"
expect 0 "run with 1 GB available" env EPYQ_MEM_AVAILABLE=1000000000 "$EPYQ" $R -p "$P"
grep '^{"event":"model_loaded"' "$T/err" | jq -e '.gb_per_s > 0 and .bytes > 0' >/dev/null &&
    ok "load line: $(grep '^{"event":"model_loaded"' "$T/err" | jq .gb_per_s) GB/s" || fail "load line without gb_per_s"

# rope scaling allows more than max_position_embeddings: YaRN factor 4 over 4096
Y="$T/yarn"
cp -r "$M" "$Y"
sed -i 's/"rope_type": *"default"/"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096/' "$Y/config.json"
expect 0 "run -c 16384 under YaRN x4" "$EPYQ" run -m "$Y" -t 1 -n 2 --temp 0 -c 16384 -p "$P"
expect 1 "run -c 16385 under YaRN x4" "$EPYQ" run -m "$Y" -t 1 -n 2 -c 16385 -p "$P"
grep -q '^epyq: -c 16385: .*16384 tokens (YaRN: original_max_position_embeddings 4096 x factor 4; max_position_embeddings 4096)' "$T/err" ||
    fail "YaRN -c refusal: $(cat "$T/err")"
finish
