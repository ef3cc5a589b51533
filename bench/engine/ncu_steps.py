#!/usr/bin/env python3
"""Sums ncu --csv per-kernel durations (gpu__time_duration.sum) by kernel name, per decode step.

Usage: ncu_steps.py ncu.csv [marker]  -- steps = launches of the marker kernel (default: the
embedding kernel, one per step). Prints a table of microseconds per step by kernel, largest first.
"""
import csv
import collections
import sys

rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
head = rows[0]
name_i, metric_i, value_i = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
unit_i = head.index("Metric Unit")
tot = collections.defaultdict(float)
cnt = collections.Counter()
for r in rows[1:]:
    if r[metric_i] != "gpu__time_duration.sum":
        continue
    v = float(r[value_i].replace(",", ""))
    v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r[unit_i]]
    name = r[name_i]
    short = name.split("(")[0].replace("void ", "").split("::")[-1].split("<")[0]
    tot[short] += v
    cnt[short] += 1
marker = sys.argv[2] if len(sys.argv) > 2 else "EmbeddingKernel"
steps = max(1, cnt.get(marker, 1))
print(f"steps: {steps}; kernel time per step: {sum(tot.values()) / steps:.1f} us")
print("| kernel | us/step | launches/step |\n|---|---:|---:|")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:18]:
    print(f"| {k[:60]} | {v / steps:.1f} | {cnt[k] / steps:.1f} |")
