#!/usr/bin/env bash
# One device call (see docs/GPU.md): where the shared-prefix cascade step's time goes. Builds
# cuda_attention_bench, runs its shared-prefix case (4096 + 128 own, B=64: flat, cascade nofold,
# cascade, lead8, lead16, smem, super; each 3 warm-up + 20 timed calls) under Nsight Compute with
# only the kernel duration collected, and prints per configuration the median duration of each
# kernel of a call (split or persistent decode kernel, merge) beside the bench's own per-call time
# (host launch work included). CASES: bench flags (default "--shared=64"; a decode case, e.g.
# --decode=64,1024, runs 226 calls a configuration: 3 + 200 back to back, then 3 + 20; flags of one
# case joined by "+", e.g. "--cascade-only+--super=16").
# NCU_FLAGS: more ncu flags, e.g. "--cache-control none --clock-control none" (partials then stay
# in L2 between the kernels, as in the bench; by default ncu flushes caches and locks base
# clocks). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
. scripts/device_gpu_subdirs.sh
t0=$(date +%s)
bash scripts/device_build.sh cuda_attention_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
. build-gpu/env.sh
echo "build: $(( $(date +%s) - t0 )) s"
for c in ${CASES:---shared=64}; do
  name=$(tr -c 'a-z0-9' '_' <<<"$c")
  read -ra flags <<<"${c//+/ }"
  timeout 400 ncu ${NCU_FLAGS:-} --metrics gpu__time_duration.sum --csv --print-units base \
    build-gpu/bench/cuda_attention_bench "${flags[@]}" >"$OUT/ncu_$name.csv" 2>"$OUT/ncu_$name.err" ||
    { echo "ncu $c rc=$?"; tail -5 "$OUT/ncu_$name.err"; }
  grep -E "^(shared|tree|decode)" "$OUT/ncu_$name.csv" | head -20
  per=23
  [[ $c == --decode* ]] && per=226
  python3 - "$OUT/ncu_$name.csv" $per <<'PY'
import csv, re, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
launches = []
for r in rows[1:]:
    if r[mi] != "gpu__time_duration.sum":
        continue
    m = re.search(r"(SplitRegKernel|SplitKernel|MergeKernel|DecodeWsKernel|PrefillWsKernel|PrefillKernel)(<[^>]*>)?", r[ki])
    if not m:
        continue
    launches.append((m.group(1) + (m.group(2) or ""), float(r[vi].replace(",", "")) / 1e3))
# A call: [wide items' PrefillWsKernel] [split or persistent decode kernel] [MergeKernel].
calls = []
for name, us in launches:
    prev = calls[-1][-1][0] if calls else ""
    joins = name.startswith("Merge") or (
        name.startswith(("Split", "DecodeWs")) and prev.startswith("PrefillWs"))
    if not calls or not joins:
        calls.append([])
    calls[-1].append((name, us))
per = int(sys.argv[2])
print(f"{len(launches)} attention launches, {len(calls)} calls ({per} a configuration)")
for c0 in range(0, len(calls), per):
    group = calls[c0:c0 + per]
    kinds = {}
    for call in group:
        for name, us in call:
            kinds.setdefault(name, []).append(us)
    tot = statistics.median(sum(us for _, us in call) for call in group)
    parts = ", ".join(f"{n} {statistics.median(v):.1f} us" for n, v in kinds.items())
    print(f"config {c0 // per}: kernels {tot:.1f} us a call = {parts}")
PY
done
echo "total: $(( $(date +%s) - t0 )) s"
