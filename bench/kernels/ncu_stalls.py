#!/usr/bin/env python3
"""Prints a kernel's warp stall reasons from Nsight Compute's raw page (`ncu -i REPORT --page raw
--csv | python3 bench/kernels/ncu_stalls.py [N] [PREFIX]`): the N largest (default 8) of the
smsp__average_warp_latency_issue_stalled_* ratios, in warps per issued instruction, after PREFIX
(default "  stalls")."""
import csv
import sys


def main(argv):
    top = int(argv[1]) if len(argv) > 1 else 8
    prefix = argv[2] if len(argv) > 2 else "  stalls"
    rows = list(csv.reader(sys.stdin))
    if len(rows) < 2:
        print(prefix + ": no report rows")
        return 1
    head, vals = rows[0], rows[-1]
    stalls = []
    for i, h in enumerate(head):
        if "issue_stalled_" in h and h.endswith("_per_issue_active.ratio") and "not_issued" not in h:
            try:
                name = h.split("issue_stalled_")[1][:-len("_per_issue_active.ratio")]
                stalls.append((float(vals[i]), name))
            except ValueError:
                pass
    print(prefix + " (warps per issue): " +
          ", ".join("%s %.2f" % (n, v) for v, n in sorted(stalls, reverse=True)[:top]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
