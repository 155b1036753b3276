#!/bin/sh
# `--ep` in run, batch and bench (one model over MPI ranks, each holding 1/N of the routed
# experts, rows exchanged by MPI_Alltoallv/MPI_Allgatherv): on loopback with -np 2 and 3, run's
# greedy and seeded text equals one process's, batch's records equal one process's file, and
# bench prints one ep report per test. SKIP (77) without an MPI build or mpirun.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
mpi_setup
make_model
for args in "--temp 0" "-s 7" "--temp 0 --spec mtp"; do
    "$EPYQ" run -m "$M" -p "Once upon a time" -n 24 $args -t 1 >"$T/one.txt" 2>/dev/null || fail "one process run ($args)"
    for np in 2 3; do
        $MPIRUN -np $np "$EPYQ" run --ep -m "$M" -p "Once upon a time" -n 24 $args -t 1 >"$T/ep.txt" 2>"$T/err" || fail "-np $np run --ep ($args)"
        cmp -s "$T/one.txt" "$T/ep.txt" && ok "-np $np run --ep text = one process's ($args)" || fail "-np $np run --ep text differs ($args)"
    done
done
i=0
while [ $i -lt 8 ]; do
    printf '{"custom_id":"r%d","method":"POST","url":"/v1/completions","body":{"prompt":"Story %d","max_tokens":%d,"seed":%d}}\n' $i $i $((4 + i % 3 * 7)) $i
    i=$((i + 1))
done >"$T/in.jsonl"
echo '{"custom_id":"c", this is not json' >>"$T/in.jsonl"
B="batch -t 1 -c 256 --max-batch 3"
expect 2 "one process batch" "$EPYQ" $B -m "$M" -i "$T/in.jsonl" -o "$T/one.jsonl"
for np in 2 3; do
    expect 2 "-np $np batch --ep" $MPIRUN -np $np "$EPYQ" $B --ep -m "$M" -i "$T/in.jsonl" -o "$T/ep$np.jsonl"
    cmp -s "$T/one.jsonl" "$T/ep$np.jsonl" && ok "-np $np batch --ep records = one process's" || fail "-np $np batch --ep records differ"
done
expect 0 "bench --ep" $MPIRUN -np 2 "$EPYQ" bench --ep -m "$M" -p 8 -n 8 -t 1 -r 1 --membw-mb 8
[ "$(grep -c '"event":"ep","ranks":2' "$T/err")" = 2 ] || fail "bench --ep: expected 2 ep reports"
[ "$(grep -c '| tg8 ' "$T/out")" = 1 ] || fail "bench --ep: rank 0 alone prints the table"
finish
