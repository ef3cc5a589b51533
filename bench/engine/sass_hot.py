"""Reads ncu's `--page source --print-source sass --csv` export of one kernel and prints the
instructions with the most warp stall samples (with their address and share) and the samples
summed per opcode; with CONTEXT > 0, the CONTEXT instructions before each of the 10 hottest (and
2 after), to tell which wait a branch or barrier is. Usage: sass_hot.py FILE.csv [TOP] [CONTEXT]."""
import collections
import csv
import sys


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    rows = list(csv.reader(lines))
    start = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    rows = rows[start:]  # ncu writes the kernel's name on a row of its own first
    head = rows[0]

    def col(*names):
        for n in names:
            for i, h in enumerate(head):
                if h.strip() == n:
                    return i
        for n in names:
            for i, h in enumerate(head):
                if n.lower() in h.lower():
                    return i
        return None

    src = col("Source")
    addr = col("Address")
    samp = col("Warp Stall Sampling (All Samples)", "Warp Stall Sampling")
    execd = col("Instructions Executed")
    if src is None or samp is None:
        print("columns:", head)
        return
    data = []
    for r in rows[1:]:
        try:
            s = float(r[samp].replace(",", "") or 0)
        except ValueError:
            continue
        e = 0.0
        if execd is not None:
            try:
                e = float(r[execd].replace(",", "") or 0)
            except ValueError:
                pass
        data.append((s, e, r[addr] if addr is not None else "", r[src].strip()))
    total = sum(d[0] for d in data) or 1.0
    total_e = sum(d[1] for d in data) or 1.0
    print(f"{len(data)} instructions, {total:.0f} stall samples, {total_e:.0f} warp instructions executed")
    for s, e, a, t in sorted(data, reverse=True)[:top]:
        print(f"{100 * s / total:5.1f}% {e:10.0f}  {a}  {t}")
    # Hot regions in address order (runs of instructions executed >= 1/4 of the busiest one's
    # count, gaps up to 8 instructions): which loop of the kernel the work is in.
    hot = max(d[1] for d in data) / 4 if data else 0
    regions, cur = [], None
    for i, (s, e, a, t) in enumerate(data):
        if e >= hot:
            if cur is None or i - cur[1] > 8:
                if cur:
                    regions.append(cur)
                cur = [i, i, 0.0, 0.0, e]
            cur[1] = i
        if cur is not None and i - cur[1] <= 8:
            cur[2] += e
            cur[3] += s
            cur[4] = max(cur[4], e)
    if cur:
        regions.append(cur)
    print("hot regions (instruction index range, executed %, stall %, max count, first instruction):")
    for a, b, e, s, m in regions:
        if e / total_e > 0.005:
            print(f"  {a:5d}-{b:5d} {100 * e / total_e:5.1f}% {100 * s / total:5.1f}% {m:9.0f}  {data[a][3][:60]}")
    by_op = collections.Counter()
    by_op_e = collections.Counter()
    for s, e, a, t in data:
        op = t.split()[0] if t else "?"
        if op.startswith("@"):
            op = t.split()[1] if len(t.split()) > 1 else op
        op = op.split(".")[0]
        by_op[op] += s
        by_op_e[op] += e
    print("by opcode (stall samples %, executed %):")
    for op, s in by_op.most_common(25):
        print(f"  {op:10s} {100 * s / total:5.1f}% {100 * by_op_e[op] / total_e:5.1f}%")
    if context > 0:
        order = sorted(range(len(data)), key=lambda i: data[i][0], reverse=True)[:10]
        for i in order:
            print(f"-- around {data[i][2]} ({100 * data[i][0] / total:.1f}%):")
            for k in range(max(0, i - context), min(len(data), i + 3)):
                s, e, a, t = data[k]
                mark = ">>" if k == i else "  "
                print(f"{mark} {k:5d} {100 * s / total:5.1f}% {e:9.0f}  {t}")


main()
