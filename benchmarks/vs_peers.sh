#!/usr/bin/env bash
# benchmarks/vs_peers.sh — epyq side by side with llama.cpp and ik_llama.cpp on this machine.
#
#   benchmarks/vs_peers.sh --peers DIR [--layers N] [--rounds R] [-r REPS] [-t THREADS]
#                          [--prompts 512] [--gen N] [--batches 1,8,32] [--requant SPEC]...
#                          [--paths a8[,a8all]] [--work DIR] [--peer-timeout SEC]
#
# DIR holds the peers built outside the repository by ../shared/peers/build.sh:
# DIR/llama.cpp and DIR/ik_llama.cpp (each with build/bin/llama-bench and a SNAPSHOT file). The
# script writes (once, into --work, default DIR) a same-shape GGUF with ../shared/peers/mkgguf.py
# and an `epyq synth --shape 35b-a3b --format ct` checkpoint with the same number of layers, then
# runs R rounds, each alternating the programs one at a time (never two at once: this machine
# drifts within minutes, so medians over alternating rounds are what compare):
#   epyq bench            ppN + tg, batched tg, per --paths (a8all: a row set of its own);
#                         tg (every --batches count) again with each --requant SPEC given
#                         (repeat the option: --requant lm_head=int8 --requant lm_head=int4)
#   ik_llama.cpp          llama-bench -rtr 1 (repack at load, its fastest CPU mode), batched-bench
#   llama.cpp             llama-bench without mmap (-lm none, older builds -mmp 0: these VMs
#                         reclaim mmapped pages), batched-bench
# (the peers' batched-bench only when --batches has a count above 1: llama-bench's tg row times
# one sequence already) and prints one table: t/s medians per test and the ratios epyq / peer.
# Peers are measured, never copied. With 40 layers the epyq files and the GGUF do not fit in
# the page cache together, so each program reloads from disk (a few minutes each on this VM).
# --prompts takes a list (512,4096): every program runs each prompt length, in ubatches of 512
# tokens for all three (llama-bench's default -ub, epyq bench's default -u).
# --peer-timeout (default 1800 s) stops a peer command that runs longer: ik_llama.cpp's batched
# bench at B = 32 on this shape has fallen back to one token at a time and had to be stopped by
# hand; its finished rows are kept.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
peers='' ptimeout=1800 layers=8 rounds=3 reps=3 threads=2 gen=128 batches=1,8,32 requants=() work='' prompts=512 paths=a8
while [ $# -gt 0 ]; do
  case "$1" in
    --peers) peers=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --paths) paths=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --requant) requants+=("$2"); shift 2 ;;
    --work) work=$2; shift 2 ;;
    --peer-timeout) ptimeout=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "vs_peers: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
case $ptimeout in ''|*[!0-9]*|0) echo "vs_peers: --peer-timeout wants whole seconds > 0, got '$ptimeout'" >&2; exit 2 ;; esac
[ -n "$peers" ] || { echo "vs_peers: --peers DIR is required (see ../shared/peers/README.md)" >&2; exit 2; }
work=${work:-$peers}
epyq=$here/epyq
[ -x "$epyq" ] || { echo "vs_peers: build epyq first ($epyq missing)" >&2; exit 2; }
shared=${EPYQ_SHARED:-$here/../shared}
py=/usr/bin/python3
for p in llama.cpp ik_llama.cpp; do
  [ -x "$peers/$p/build/bin/llama-bench" ] || { echo "vs_peers: $peers/$p/build/bin/llama-bench missing" >&2; exit 2; }
done
mkdir -p "$work"
gguf=$work/q35-${layers}L-Q4_0.gguf
model=$work/epyq-35b-${layers}L-ct
if [ ! -s "$gguf" ]; then
  echo "vs_peers: writing $gguf" >&2
  PYTHONPATH=$peers/llama.cpp/gguf-py $py "$shared/peers/mkgguf.py" --layers "$layers" --out "$gguf.tmp" >&2
  mv "$gguf.tmp" "$gguf"
fi
if [ ! -f "$model/config.json" ]; then
  echo "vs_peers: writing $model" >&2
  "$epyq" synth -o "$model" --shape 35b-a3b --layers "$layers" --format ct >&2
fi
out=$work/vs_peers-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
echo "vs_peers: raw results in $out" >&2
nb=${batches//,/ }
multi=0
for b in $nb; do [ "$b" = 1 ] || multi=1; done
# llama.cpp without mmap: newer builds (34af94cd) replaced -mmp 0 by --load-mode none
nommap=(-mmp 0)
help=$("$peers/llama.cpp/build/bin/llama-bench" --help 2>&1 || true)
case $help in *--load-mode*) nommap=(-lm none) ;; esac
for r in $(seq 1 "$rounds"); do
  echo "vs_peers: round $r/$rounds" >&2
  "$epyq" bench -m "$model" -p "$prompts" -n "$gen" -b "$batches" -t "$threads" -r "$reps" -o jsonl --path "$paths" \
    >"$out/epyq-$r.jsonl" 2>"$out/epyq-$r.err"
  for i in "${!requants[@]}"; do
    "$epyq" bench -m "$model" -p 0 -n "$gen" -b "$batches" -t "$threads" -r "$reps" -o jsonl --requant "${requants[$i]}" \
      >"$out/epyq-rq$i-$r.jsonl" 2>"$out/epyq-rq$i-$r.err"
  done
  timeout "$ptimeout" "$peers/ik_llama.cpp/build/bin/llama-bench" -m "$gguf" -p "$prompts" -n "$gen" -t "$threads" -r "$reps" -rtr 1 -o json \
    >"$out/ik-$r.json" 2>"$out/ik-$r.err" || echo "vs_peers: ik_llama.cpp llama-bench failed (exit $?, see $out/ik-$r.err)" >&2
  timeout "$ptimeout" "$peers/llama.cpp/build/bin/llama-bench" -m "$gguf" -p "$prompts" -n "$gen" -t "$threads" -r "$reps" "${nommap[@]}" -o jsonl \
    >"$out/llama-$r.jsonl" 2>"$out/llama-$r.err" || echo "vs_peers: llama.cpp llama-bench failed (exit $?, see $out/llama-$r.err)" >&2
  for p in ik_llama.cpp llama.cpp; do
    bb=$peers/$p/build/bin/llama-batched-bench
    [ -x "$bb" ] || continue
    # one sequence only: llama-bench's tg row above already times it (a model load saved)
    [ "$multi" = 1 ] || continue
    extra=; [ "$p" = ik_llama.cpp ] && extra=-rtr
    timeout "$ptimeout" "$bb" -m "$gguf" -c 8192 -b 2048 -ub 512 -npp 128 -ntg "$gen" -npl "$batches" -t "$threads" $extra \
      >"$out/${p%%.*}-batched-$r.txt" 2>"$out/${p%%.*}-batched-$r.err" || true
  done
done
$py - "$out" "$rounds" "$gen" "$nb" "$peers" "$(lscpu | sed -n 's/^Model name: *//p')" "$prompts" "$paths" "${requants[@]}" <<'EOF'
import glob, json, os, re, statistics, sys
out, rounds, gen, batches, peers, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5], sys.argv[6]
prompts, paths, requants = sys.argv[7].split(","), sys.argv[8].split(","), sys.argv[9:]
def jl(path):
    try:
        with open(path) as f:
            t = f.read().strip()
        if not t: return []
        return json.loads(t) if t.startswith('[') else [json.loads(l) for l in t.splitlines() if l.startswith('{')]
    except (OSError, ValueError):
        return []
res = {}  # (program, test) -> [t/s per round]
def add(prog, test, v):
    if v and v > 0: res.setdefault((prog, test), []).append(v)
for r in range(1, rounds + 1):
    for row in jl(f"{out}/epyq-{r}.jsonl"):
        add("epyq" if row.get("path") in ("a8", None) else "epyq " + row["path"], row["test"], row["avg_ts"])
    for i, spec in enumerate(requants):
        for row in jl(f"{out}/epyq-rq{i}-{r}.jsonl"):
            add("epyq " + spec, row["test"], row["avg_ts"])
    for prog, f in (("ik_llama.cpp -rtr", f"{out}/ik-{r}.json"), ("llama.cpp", f"{out}/llama-{r}.jsonl")):
        for row in jl(f):
            npp, ntg = row.get("n_prompt", 0), row.get("n_gen", 0)
            add(prog, f"pp{npp}" if npp else f"tg{ntg}", row.get("avg_ts"))
    for prog, base in (("ik_llama.cpp -rtr", f"{out}/ik_llama-batched-{r}"), ("llama.cpp", f"{out}/llama-batched-{r}")):
        # ik_llama.cpp prints its table on stderr, llama.cpp on stdout; a run that aborts
        # part-way (ik_llama.cpp at B = 32 on this shape) still leaves its finished rows.
        txt = ""
        for ext in (".txt", ".err"):
            try: txt += open(base + ext).read()
            except OSError: pass
        # |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
        for line in txt.splitlines():
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if len(cells) >= 8 and cells[2].isdigit():
                b = int(cells[2])
                add(prog, f"tg{gen}" + (f" b{b}" if b > 1 else " (batched-bench)"), float(cells[7]) * 1.0)
tests = [f"pp{p}" for p in prompts] + [f"tg{gen}"] + [f"tg{gen} b{b}" for b in batches if b != "1"]
progs = ["epyq", "ik_llama.cpp -rtr", "llama.cpp"]
# further epyq paths and requantised runs: a column and a ratio to ik each
extra = ["epyq " + p for p in paths if p != "a8"] + ["epyq " + q for q in requants]
med = lambda k: statistics.median(res[k]) if k in res else None
print(f"machine: {cpu}; {rounds} alternating rounds, t/s medians (aggregate t/s for bB)")
for p in ("ik_llama.cpp", "llama.cpp"):
    try: print(f"{p}: " + open(f"{peers}/{p}/SNAPSHOT").readline().strip())
    except OSError: pass
print("| test | " + " | ".join(progs + extra) + " | epyq / ik | epyq / llama.cpp |" +
      "".join(f" {p.split()[1]} / ik |" for p in extra))
print("|---|" + "---:|" * (len(progs) + 2 * len(extra) + 2))
for t in tests:
    v = [med((p, t)) for p in progs]
    e = [med((p, t)) for p in extra]
    cell = lambda x: f"{x:.2f}" if x else "–"
    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "–"
    print(f"| {t} | " + " | ".join(cell(x) for x in v + e) + f" | {ratio(v[0], v[1])} | {ratio(v[0], v[2])} |" +
          "".join(f" {ratio(x, v[1])} |" for x in e))
EOF
