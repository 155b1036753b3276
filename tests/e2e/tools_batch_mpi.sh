#!/bin/sh
# `epyq batch` over MPI ranks (tools/batch_mpi.h) on loopback: the output of mpirun -np 2 and
# -np 3 is byte-identical to one process's on the same job (bad lines, a duplicate, chat and
# completions of different lengths); a rank that fails is named with its requests left, and
# --resume under mpirun then gives the single-process file; so do a SIGTERM to mpirun mid-run
# and a single-process partial file resumed over ranks. SKIP (77) without an MPI build or
# without mpirun. Every mpirun is bounded by timeout.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
mpi_setup
make_model
B="batch -t 1 -c 256 --max-batch 3"
i=0
while [ $i -lt 20 ]; do
    # prompts and max_tokens of different lengths, so the longest-first split is uneven
    pad=$(printf 'w%.0s ' $(seq 0 $((i * 2))))
    printf '{"custom_id":"r%d","method":"POST","url":"/v1/completions","body":{"prompt":"Story %d: %s","max_tokens":%d,"seed":%d}}\n' \
        $i $i "$pad" $((4 + i % 5 * 9)) $i
    i=$((i + 1))
done >"$T/in.jsonl"
{
    echo '{"custom_id":"c", this is not json'
    echo '{"custom_id":"r3","method":"POST","url":"/v1/completions","body":{"prompt":"dup","max_tokens":2}}'
    echo '{"custom_id":"chat","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":6,"seed":1}}'
    echo '{"prompt":"plain form","max_tokens":3}'
} >>"$T/in.jsonl"
expect 2 "single process (bad lines exit 2)" "$EPYQ" $B -m "$M" -i "$T/in.jsonl" -o "$T/one.jsonl"
[ "$(wc -l <"$T/one.jsonl")" = 24 ] || fail "single process: expected 24 records, got $(wc -l <"$T/one.jsonl")"

for np in 2 3; do
    expect 2 "mpirun -np $np (bad lines exit 2)" $MPIRUN -np $np "$EPYQ" $B -m "$M" -i "$T/in.jsonl" -o "$T/np$np.jsonl"
    cmp "$T/one.jsonl" "$T/np$np.jsonl" && ok "-np $np output = single-process output" || fail "-np $np output differs"
done
grep -q '24/24 done, 2 failed' "$T/err" || fail "the lead's progress does not cover the whole job: $(grep 'done' "$T/err" | tail -1)"
grep -q 'batch: 3 ranks' "$T/err" || fail "no rank count in the summary"
# A rank that loads the model from a folder of another name (another host's path): the
# records name rank 0's folder, as one process would.
ln -s "$M" "$T/other-name"
expect 2 "ranks with differently named model folders" $MPIRUN -np 1 "$EPYQ" $B -m "$M" -i "$T/in.jsonl" -o "$T/named.jsonl" : \
    -np 1 "$EPYQ" $B -m "$T/other-name" -i "$T/in.jsonl" -o "$T/named.jsonl"
cmp "$T/one.jsonl" "$T/named.jsonl" && ok "records name rank 0's model folder" || fail "model names differ across ranks"
# More ranks than requests (two ranks idle), and no requests at all.
head -n 1 "$T/in.jsonl" >"$T/in1.jsonl"
expect 0 "one request, one process" "$EPYQ" $B -m "$M" -i "$T/in1.jsonl" -o "$T/one1.jsonl"
expect 0 "one request over 3 ranks" $MPIRUN -np 3 "$EPYQ" $B -m "$M" -i "$T/in1.jsonl" -o "$T/np1.jsonl"
cmp "$T/one1.jsonl" "$T/np1.jsonl" && ok "idle ranks: output = single-process output" || fail "idle ranks: output differs"
: >"$T/empty.jsonl"
expect 0 "an empty job over 2 ranks" $MPIRUN -np 2 "$EPYQ" $B -m "$M" -i "$T/empty.jsonl" -o "$T/empty.out"
[ ! -s "$T/empty.out" ] || fail "an empty job wrote records"

# A rank that cannot load its model: the lead finishes its own share, names the rank and how
# many requests it left, exits 1 (no hang); --resume over two good ranks completes the file.
expect 1 "a failed rank" $MPIRUN -np 1 "$EPYQ" $B -m "$M" -i "$T/in.jsonl" -o "$T/fail.jsonl" : \
    -np 1 "$EPYQ" $B -m "$T/no-such-model" -i "$T/in.jsonl" -o "$T/fail.jsonl"
grep -q 'batch: rank 1 failed: .*no-such-model.*; its [1-9][0-9]* unfinished requests are left for --resume' "$T/err" &&
    ok "the failed rank is reported with its requests left" || { fail "failed rank report"; grep batch: "$T/err"; }
n=$(wc -l <"$T/fail.jsonl")
[ "$n" -lt 24 ] || fail "the failed rank's requests were written ($n records)"
expect 2 "--resume after the failed rank" $MPIRUN -np 2 "$EPYQ" $B -m "$M" -i "$T/in.jsonl" -o "$T/fail.jsonl" --resume
cmp "$T/one.jsonl" "$T/fail.jsonl" && ok "resumed after a failed rank = single-process output" || fail "resume after a failed rank differs"

# SIGTERM to mpirun mid-run (it forwards the signal to every rank): the lead writes the
# finished prefix; --resume with another rank count completes it byte for byte.
i=0
while [ $i -lt 24 ]; do
    printf '{"custom_id":"s%d","method":"POST","url":"/v1/completions","body":{"prompt":"Tale %d:","max_tokens":120,"seed":%d}}\n' $i $i $i
    i=$((i + 1))
done >"$T/big.jsonl"
B="batch -t 1 -c 256 --max-batch 4"
expect 0 "single process, long job" "$EPYQ" $B -m "$M" -i "$T/big.jsonl" -o "$T/full.jsonl"
$MPIRUN -np 2 "$EPYQ" $B -m "$M" -i "$T/big.jsonl" -o "$T/part.jsonl" >/dev/null 2>"$T/err" &
pid=$!
i=0; while [ ! -s "$T/part.jsonl" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
kill -TERM $pid; wait $pid; rc=$?
# mpirun can return before every rank has finished its last step and written its records:
# wait until no rank of that job is left (else the resume below races with it).
i=0; while pgrep -f -- "-o $T/part.jsonl" >/dev/null 2>&1 && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
n=$(wc -l <"$T/part.jsonl")
if [ "$n" -lt 24 ]; then ok "SIGTERM to mpirun: exit $rc with $n of 24 records"; else echo "note: the job finished before SIGTERM"; fi
expect 0 "--resume over 3 ranks" $MPIRUN -np 3 "$EPYQ" $B -m "$M" -i "$T/big.jsonl" -o "$T/part.jsonl" --resume
cmp "$T/full.jsonl" "$T/part.jsonl" && ok "resumed over ranks after SIGTERM = single-process output" || fail "resume after SIGTERM differs"

# A single process's partial file (a torn last line too) resumed over ranks.
head -n 7 "$T/full.jsonl" >"$T/half.jsonl"
printf '{"id":"batch_req_x","custom_id":"s' >>"$T/half.jsonl"
expect 0 "single-process file resumed by mpirun -np 2" $MPIRUN -np 2 "$EPYQ" $B -m "$M" -i "$T/big.jsonl" -o "$T/half.jsonl" --resume
cmp "$T/full.jsonl" "$T/half.jsonl" && ok "resumed over ranks = single-process output" || fail "resume over ranks differs"
expect 1 "an existing output without --resume is refused by the lead" $MPIRUN -np 2 "$EPYQ" $B -m "$M" -i "$T/big.jsonl" -o "$T/half.jsonl"
[ "$(grep -c 'exists and is not empty' "$T/err")" = 1 ] || fail "expected the refusal once (from the lead), got: $(grep -c 'exists and is not empty' "$T/err")"
# srun without an MPI plugin starts independent tasks: each would run the whole job into the
# same file, so epyq refuses.
SLURM_STEP_NUM_TASKS=2 expect 1 "srun without MPI is refused" "$EPYQ" $B -m "$M" -i "$T/big.jsonl" -o "$T/srun.jsonl"
grep -q 'srun --mpi=pmix' "$T/err" || fail "the srun refusal does not say what to use: $(cat "$T/err")"
finish
