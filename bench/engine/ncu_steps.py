#!/usr/bin/env python3
"""Sums ncu --csv per-kernel durations (gpu__time_duration.sum) by kernel name, per decode step.

Usage: ncu_steps.py ncu.csv [marker]  -- a step is the run of kernels from one launch of the
marker kernel (default: the embedding kernel, one per step) to the next. Steps are grouped by
their kernel sequence; the most common sequence (the decode steps of the profiled batch) is
averaged, so load-time kernels, prefill and other steps in the window drop out. Prints a table of
microseconds per step by kernel, largest first.
"""
import csv
import collections
import sys

rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
head = rows[0]
name_i, metric_i, value_i = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
unit_i = head.index("Metric Unit")
id_i = head.index("ID") if "ID" in head else None
kernels = []  # (short name, us) in launch order
for r in rows[1:]:
    if r[metric_i] != "gpu__time_duration.sum":
        continue
    v = float(r[value_i].replace(",", ""))
    v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r[unit_i]]
    short = r[name_i].split("(")[0].replace("void ", "").split("::")[-1].split("<")[0]
    kernels.append((short, v))
marker = sys.argv[2] if len(sys.argv) > 2 else "EmbeddingKernel"
steps, cur = [], None
for k in kernels:
    if k[0] == marker:
        if cur is not None:
            steps.append(cur)
        cur = []
    if cur is not None:
        cur.append(k)
by_sig = collections.defaultdict(list)
for s in steps:
    by_sig[tuple(k[0] for k in s)].append(s)
if not by_sig:
    sys.exit(f"no complete step (marker {marker}) among {len(kernels)} kernels")
sig, group = max(by_sig.items(), key=lambda kv: len(kv[1]))
print(f"kernels profiled: {len(kernels)}; complete steps: {len(steps)}; averaged: {len(group)} "
      f"steps of {len(sig)} kernels (the most common sequence)")
tot, cnt = collections.defaultdict(float), collections.Counter()
for s in group:
    for name, us in s:
        tot[name] += us
        cnt[name] += 1
n = len(group)
print(f"kernel time per step: {sum(tot.values()) / n:.1f} us")
print("| kernel | us/step | launches/step | us/launch |\n|---|---:|---:|---:|")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:20]:
    print(f"| {k[:60]} | {v / n:.1f} | {cnt[k] / n:.1f} | {v / cnt[k]:.2f} |")
