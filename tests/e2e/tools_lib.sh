# tests/e2e/tools_lib.sh — sourced by the tools_*.sh tests: the built binary, a temp dir that
# is removed on exit, a tiny synthetic checkpoint in it, and check helpers.
# Exit statuses follow automake: 0 pass, 1 fail, 77 skip.
set -u
EPYQ=${EPYQ_BIN:-$PWD/epyq}
[ -x "$EPYQ" ] || { echo "no epyq binary at $EPYQ"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/epyq-tools.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
# Keep generated models and history out of the user's home.
export XDG_CACHE_HOME="$T/cache" XDG_STATE_HOME="$T/state"
FAILS=0

fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }
# expect STATUS DESC CMD...: run CMD, compare its exit status.
expect() {
    want=$1 desc=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; got=$?
    if [ "$got" = "$want" ]; then ok "$desc"; else fail "$desc: exit $got, expected $want"; sed 's/^/  | /' "$T/err" | head -5; fi
}
# A tiny ct checkpoint (int4 experts, byte-level BPE tokenizer, Qwen chat template).
make_model() {
    M="$T/tiny"
    "$EPYQ" synth -o "$M" --shape tiny --format ct -t 1 >"$T/synth.log" 2>&1 || { cat "$T/synth.log"; exit 1; }
}
# A copy of the tiny model $M in $T/long whose config allows 65536 positions: a request for
# 60000 tokens with ignore_eos outlasts any client that goes away, on any machine (the tiny
# model decodes thousands of tokens a second, so a shorter one can finish first).
make_long_model() {
    cp -r "$M" "$T/long"
    sed -i 's/"max_position_embeddings": *4096/"max_position_embeddings": 65536/' "$T/long/config.json"
}
# The MPI tests' start: SKIP (77) without an MPI build or without mpirun; CI runs as root in a
# container, which Open MPI refuses unless told; loopback TCP only, every mpirun bounded.
mpi_setup() {
    grep -q '^#define EPYQ_HAVE_MPI 1' "${EPYQ_BUILDDIR:-.}/config.h" 2>/dev/null || { echo "SKIP: built without MPI"; exit 77; }
    command -v mpirun >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    MPIRUN="timeout -k 10 120 mpirun --oversubscribe ${EPYQ_MPIRUN_ARGS:---mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo}"
}
finish() { [ "$FAILS" = 0 ] && { echo "all passed"; exit 0; }; echo "$FAILS failed"; exit 1; }
