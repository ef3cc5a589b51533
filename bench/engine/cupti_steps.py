#!/usr/bin/env python3
"""Where a CUDA graph replay's time goes, from cupti_trace.cc's CSV (kernels not serialized).

For every captured graph replayed at least --min-launches times (engine_bench: one graph per decode
batch bucket), each replay's kernels are walked in order of their end: a kernel's "gap" is the idle
time between the previous end and its start, its "exposed" time the part of it after the previous
end (what it adds to the replay's span; a kernel that ran beside another adds only its overhang).
gap + exposed over all kernels is the replay's span exactly. Printed per graph: replays, kernels a
replay, the median span and sum of kernel durations, then per kernel name the launches a replay,
the median duration, and the mean exposed and gap time a replay.

  python3 bench/engine/cupti_steps.py trace.csv [--min-launches 5] [--top 25]
"""
import argparse
import collections
import csv
import shutil
import statistics
import subprocess
import sys


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def short(name):
    """The kernel's function name without namespaces, return type, arguments and long template
    arguments (cuBLAS's own kernel names are kept whole)."""
    base = name.replace("(anonymous namespace)::", "").split("(")[0]
    if base.startswith("void "):
        base = base[5:]
    head, lt, tail = base.partition("<")
    head = head.rsplit("::", 1)[-1]
    return head + (lt + tail[:40] if lt else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--min-launches", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    launches = collections.defaultdict(list)  # (graph, correlation) -> kernels
    eager = []
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            k = (int(r["start_ns"]), int(r["end_ns"]), r["name"])
            g = int(r["graph_id"])
            if g:
                launches[(g, int(r["correlation_id"]))].append(k)
            else:
                eager.append(k)
    names = demangle(sorted({k[2] for ks in launches.values() for k in ks}))
    by_graph = collections.defaultdict(list)
    for (g, _), ks in launches.items():
        by_graph[g].append(sorted(ks, key=lambda k: k[1]))
    print(f"# {sum(len(v) for v in launches.values())} graph kernels in {len(launches)} replays "
          f"of {len(by_graph)} graphs; {len(eager)} kernels outside graphs")
    for g, reps in sorted(by_graph.items(), key=lambda kv: min(r[0][0] for r in kv[1])):
        if len(reps) < a.min_launches:
            continue
        sizes = collections.Counter(len(r) for r in reps)
        n_nodes = sizes.most_common(1)[0][0]
        reps = [r for r in reps if len(r) == n_nodes]
        spans, busy = [], []
        per = collections.defaultdict(lambda: {"dur": [], "exp": 0.0, "gap": 0.0, "n": 0})
        for r in reps:
            t0 = min(k[0] for k in r)
            cur = t0
            spans.append((r[-1][1] - t0) / 1e3)
            busy.append(sum(k[1] - k[0] for k in r) / 1e3)
            for s, e, name in r:
                p = per[short(names.get(name, name))]
                p["dur"].append((e - s) / 1e3)
                p["gap"] += max(0, s - cur) / 1e3
                p["exp"] += (e - max(cur, s)) / 1e3
                p["n"] += 1
                cur = e
        nrep = len(reps)
        span = statistics.median(spans)
        print(f"\n## graph {g}: {nrep} replays of {n_nodes} kernels; span median {span:.1f} us "
              f"(min {min(spans):.1f}); kernel durations summed {statistics.median(busy):.1f} us")
        print("\n| kernel | per replay | median us | exposed us/replay | gap us/replay | share |")
        print("|---|---:|---:|---:|---:|---:|")
        rows = sorted(per.items(), key=lambda kv: -(kv[1]["exp"] + kv[1]["gap"]))
        for name, p in rows[: a.top]:
            exp, gap = p["exp"] / nrep, p["gap"] / nrep
            print(f"| {name} | {p['n'] / nrep:.0f} | {statistics.median(p['dur']):.2f} | "
                  f"{exp:.1f} | {gap:.1f} | {(exp + gap) / span:.0%} |")
        rest = rows[a.top:]
        if rest:
            exp = sum(p["exp"] for _, p in rest) / nrep
            gap = sum(p["gap"] for _, p in rest) / nrep
            print(f"| ({len(rest)} more) | | | {exp:.1f} | {gap:.1f} | {(exp + gap) / span:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
