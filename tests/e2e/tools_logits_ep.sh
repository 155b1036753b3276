#!/bin/sh
# `epyq logits --ep` (one model over MPI ranks, each holding 1/N of the routed experts) writes
# the same bytes as one process: prompt and decode rows, --mtp drafts, both int4 paths, on the
# tiny synthetic model with -np 2 and 3, and on every ../shared fixture model present (their
# part SKIPs without them). A rank that fails ends the job (MPI_Abort) instead of leaving the
# others waiting in an exchange. SKIP (77) without an MPI build or mpirun.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
mpi_setup
make_model
ids=1,5,9,200,31,7,64,3,12,99,41,8
for args in "--decode 6" "--decode 3 --mtp --path a16"; do
    expect 0 "one process: $args" "$EPYQ" logits -m "$M" --ids $ids $args -t 1 -o "$T/one.f32"
    for np in 2 3; do
        rm -f "$T/ep.f32"
        expect 0 "mpirun -np $np --ep: $args" $MPIRUN -np $np "$EPYQ" logits --ep -m "$M" --ids $ids $args -t 1 -o "$T/ep.f32"
        cmp "$T/one.f32" "$T/ep.f32" && ok "-np $np --ep logits = one process's ($args)" || fail "-np $np --ep logits differ ($args)"
        grep -q "\"event\":\"ep\",\"ranks\":$np,\"exchanges\":[1-9]" "$T/err" || fail "no exchange report: $(grep event.:.ep "$T/err")"
    done
done
n=0
for d in "$EPYQ_SHARED"/fixtures/models/tiny-*; do
    [ -f "$d/config.json" ] || continue
    case $d in *vision*) continue ;; esac
    n=$((n + 1))
    name=$(basename "$d")
    expect 0 "fixture $name: one process" "$EPYQ" logits -m "$d" --ids $ids --decode 4 -t 1 -o "$T/one.f32"
    expect 0 "fixture $name: -np 2 --ep" $MPIRUN -np 2 "$EPYQ" logits --ep -m "$d" --ids $ids --decode 4 -t 1 -o "$T/ep.f32"
    cmp "$T/one.f32" "$T/ep.f32" && ok "fixture $name: --ep logits = one process's" || fail "fixture $name: --ep logits differ"
done
[ $n -gt 0 ] || echo "note: no fixture models under $EPYQ_SHARED/fixtures/models: their part skipped"
# One rank cannot load its model: the job ends with an error, no hang (timeout would say 124).
expect 1 "a rank that fails ends the job" $MPIRUN -np 1 "$EPYQ" logits --ep -m "$M" --ids $ids -t 1 : \
    -np 1 "$EPYQ" logits --ep -m "$T/no-such-model" --ids $ids -t 1
grep -q 'no-such-model' "$T/err" || fail "the failing rank's error is not shown"
finish
