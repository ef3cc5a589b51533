#!/usr/bin/env python3
"""Reads the wide kernel's per-work timeline and prints where a work's time goes.

`cuda_attention_bench --tree=NAME --trace=FILE` (a build configured with -DCASCADE_WS_TRACE=ON;
bench/kernels/device_ws_trace.sh) writes FILE: "cta,c,clock0,ns0,clock1,ns1" lines (a CTA's
clock64 and globaltimer at its start and after its last work) and "work,w,meta,s0..s17" lines
(clock64 stamps, attention_hopper.cuh WsTraceSlot, the last three cycle sums). Stamps are
compared only within a CTA (one SM's clock); the CTA's two clock / globaltimer pairs give its
cycles per microsecond.

Prints, per kind of work (tiles and q-rows), the median and mean in microseconds of each interval
below, warpgroup 0's tile loop by phase per tile (waiting for a stage to land, its MMAs from issue
to their wait's return, the rest: release, fold, softmax), and over all CTAs the share of
consumer warpgroup 0's time spent waiting for its item, in its tile loop, storing, and between
works.

With --dw, FILE is the persistent decode kernel's timeline (FILE.dw beside the wide kernel's:
attention_hopper.cuh DwTraceSlot; meta cta | consumer << 12 | j << 13 | tiles << 32 | q-rows <<
48): per kind of work the item warp's take, rows and Q intervals and the consumer's work, its
row warp's time a tile by phase (waiting for the tile, its MMAs, the rest; 64-row consumers,
traces since session 53), and over all consumers the share of their time spent working, waiting
between works, and before the first and after the last.

With --step, FILE and FILE.dw's CTA lines on the globaltimer (one clock for every SM): when each
kernel's CTAs started and ended from the step's first CTA start, so a step's time divides into
the wide kernel, the persistent decode kernel beside or after it, and (the rest of the row's
time) the merge and the launches.

  python3 bench/kernels/ws_trace.py FILE
  python3 bench/kernels/ws_trace.py --dw FILE.dw
  python3 bench/kernels/ws_trace.py --step FILE     (both kernels' CTA spans on one clock)
  python3 bench/kernels/ws_trace.py --self-test
"""
import statistics
import sys
from collections import defaultdict

# The stamp slots (attention_hopper.cuh WsTraceSlot), in file order after the meta word.
SLOTS = [
    "item_begin", "item_buffer", "item_rows", "item_full", "item1_buffer", "item1_full",
    "load_begin", "load_end", "wg0_wait", "wg0_start", "wg0_tiles", "wg0_stored", "wg1_start",
    "wg1_tiles", "wg1_stored",
]
# Then warpgroup 0's tile loop by phase, cycles summed over its tiles (durations, 0 for a pair's
# or a super-tile order's works): (label, slot).
PHASES = [
    ("wg0 per tile: wait for the stage", "wg0_phase_wait"),
    ("wg0 per tile: MMAs issue -> done", "wg0_phase_mma"),
    ("wg0 per tile: release, fold, softmax", "wg0_phase_math"),
]
PHASE_SLOTS = [slot for _, slot in PHASES]
# (label, later stamp, earlier stamp): the intervals printed per kind of work.
INTERVALS = [
    ("item: fields, rows, positions read", "item_rows", "item_begin"),
    ("item: then waited for its buffer", "item_buffer", "item_rows"),
    ("item: gather (buffer free -> Q landed)", "item_full", "item_buffer"),
    ("item 1: gather", "item1_full", "item1_buffer"),
    ("wg0: item ready before asked (+) / waited (-)", "wg0_wait", "item_full"),
    ("wg0: wait for the item", "wg0_start", "wg0_wait"),
    ("wg0: tile loop", "wg0_tiles", "wg0_start"),
    ("wg0: store", "wg0_stored", "wg0_tiles"),
    ("wg1: tile loop", "wg1_tiles", "wg1_start"),
    ("wg1: store", "wg1_stored", "wg1_tiles"),
    ("load 0: first tile -> last tile issued", "load_end", "load_begin"),
    ("load 0 first issue -> wg0 start", "wg0_start", "load_begin"),
]


def parse_trace(lines, slots, fields):
    """Returns ({cta: (clock0, ns0, clock1, ns1)}, [work dicts]): each work's stamps named by
    `slots`, and fields(meta) for its meta word."""
    ctas, works = {}, []
    for line in lines:
        f = line.strip().split(",")
        if not f or not f[0]:
            continue
        if f[0] == "cta":
            ctas[int(f[1])] = tuple(int(x) for x in f[2:6])
        elif f[0] == "work":
            stamps = dict(zip(slots, (int(x) for x in f[3:3 + len(slots)])))
            works.append({"w": int(f[1]), **fields(int(f[2])), **stamps})
    return ctas, works


def parse(lines):
    """Returns ({cta: (clock0, ns0, clock1, ns1)}, [work dicts]) of the wide kernel's trace."""
    return parse_trace(lines, SLOTS + PHASE_SLOTS, lambda meta: {
        "cta": meta & 0xFFF, "j": (meta >> 12) & 0xFFFFF, "tiles": (meta >> 32) & 0xFFFF,
        "q": (meta >> 48) & 0xFFF, "fold": meta >> 60,
    })


def cycle_rates(ctas):
    """{cta: cycles per microsecond} from each CTA's clock64 and globaltimer pairs."""
    return {c: (c1 - c0) / ((t1 - t0) / 1000.0)
            for c, (c0, t0, c1, t1) in ctas.items() if t1 > t0 and c1 > c0}


def intervals_by_kind(works, rate, slots, intervals, kind_of, group_of, phases=()):
    """Per kind of work (kind_of), each interval's microseconds (and each phase's microseconds a
    tile, where the work has them), and the works grouped by group_of (a CTA, a consumer) with
    the group's works in order; works of another launch, or that this launch did not finish
    stamping, are skipped. Returns (by_kind, counts, groups)."""
    by_kind = defaultdict(lambda: defaultdict(list))
    counts = defaultdict(int)
    groups = defaultdict(list)
    for w in works:
        r = rate.get(w["cta"])
        if r is None or any(w[s] == 0 for s in slots):
            continue
        k = kind_of(w)
        counts[k] += 1
        for label, later, earlier in intervals:
            by_kind[k][label].append((w[later] - w[earlier]) / r)
        if phases and any(w.get(slot, 0) for _, slot in phases):
            for label, slot in phases:
                by_kind[k][label].append(w[slot] / r / max(1, w["tiles"]))
        groups[group_of(w)].append(w)
    for ws in groups.values():
        ws.sort(key=lambda w: w["j"])
    return by_kind, counts, groups


def print_intervals(by_kind, counts, kinds, labels, width, out):
    """The per-kind table: each labelled interval's median / mean in microseconds ("-" where a
    kind has none)."""
    print("\n%-*s" % (width, "interval (us, median / mean)") +
          "".join(" %22s" % ("%s (%d)" % (k, counts[k])) for k in kinds), file=out)
    for label in labels:
        cells = []
        for k in kinds:
            v = by_kind[k].get(label, [])
            cells.append(" %22s" % ("%7.2f / %7.2f" % (statistics.median(v), statistics.mean(v))
                                    if v else "-"))
        print("%-*s%s" % (width, label, "".join(cells)), file=out)


def kind(w):
    if w["tiles"] == 1:
        return "1 tile, %d q-rows" % w["q"]
    return "%s tiles, %d q-rows" % ("2-7" if w["tiles"] < 8 else "8+", w["q"])


def analyze(ctas, works):
    """Returns (per-kind {label: [us]}, per-kind counts, wg0 time shares, cycles per us)."""
    rate = cycle_rates(ctas)
    by_kind, counts, per_cta = intervals_by_kind(works, rate, SLOTS, INTERVALS, kind,
                                                 lambda w: w["cta"], PHASES)
    shares = defaultdict(float)
    for c, ws in per_cta.items():
        r = rate[c]
        c0, _, c1, _ = ctas[c]
        shares["wait for the item"] += sum(w["wg0_start"] - w["wg0_wait"] for w in ws) / r
        shares["tile loop"] += sum(w["wg0_tiles"] - w["wg0_start"] for w in ws) / r
        shares["store"] += sum(w["wg0_stored"] - w["wg0_tiles"] for w in ws) / r
        shares["before the first work"] += (ws[0]["wg0_wait"] - c0) / r
        shares["between works"] += sum(
            b["wg0_wait"] - a["wg0_stored"] for a, b in zip(ws, ws[1:])) / r
        shares["after the last work"] += (c1 - ws[-1]["wg0_stored"]) / r
    return by_kind, counts, shares, rate


def report(ctas, works, out=sys.stdout):
    by_kind, counts, shares, rate = analyze(ctas, works)
    if not counts:
        print("ws_trace: no complete work in the trace (was it written by a --trace build?)",
              file=out)
        return 1
    print_report(ctas, (by_kind, counts, shares, rate),
                 [i[0] for i in INTERVALS] + [p[0] for p in PHASES], 46, None,
                 "consumer warpgroup 0's", True, out)
    return 0


def print_report(ctas, analysis, labels, width, kinds_shown, whose, clock, out):
    """A trace's report: its CTAs and works (with the SM clock range if `clock`), the interval
    table (rows `labels`) of its most frequent kinds (all if kinds_shown is None), and where
    whose time goes."""
    by_kind, counts, shares, rate = analysis
    rates = sorted(rate.values())
    spans = sorted((c1 - c0) / rate[c] for c, (c0, _, c1, _) in ctas.items() if c in rate)
    print("%d CTAs, %d works; %sCTA span median %.1f us, max %.1f us" %
          (len(rate), sum(counts.values()),
           "SM clock %.0f-%.0f MHz; " % (rates[0], rates[-1]) if clock else "",
           statistics.median(spans), spans[-1]), file=out)
    kinds = sorted(counts, key=lambda k: -counts[k])[:kinds_shown]
    print_intervals(by_kind, counts, kinds, labels, width, out)
    total = sum(shares.values())
    print("\n%s time over all CTAs (%.1f us):" % (whose, total), file=out)
    for name, v in shares.items():
        print("  %-24s %5.1f%%" % (name, 100.0 * v / total), file=out)


def self_test():
    """A hand-made trace: two CTAs at 1000 cycles per us, known intervals; checks the numbers."""
    lines = ["cta,0,1000,0,40000,39000", "cta,1,5000,0,35000,30000"]

    def work(w, cta, j, tiles, q, base, gap_item, loop, phases=(0, 0, 0)):
        meta = cta | j << 12 | tiles << 32 | q << 48 | 2 << 60
        s = {
            "item_begin": base, "item_rows": base + 500, "item_buffer": base + 1000,
            "item_full": base + 2000, "item1_buffer": base + 1000, "item1_full": base + 2500,
            "load_begin": base + 500, "load_end": base + 900, "wg0_wait": base + 2000 - gap_item,
            "wg0_start": base + 2500, "wg0_tiles": base + 2500 + loop,
            "wg0_stored": base + 3000 + loop, "wg1_start": base + 2500,
            "wg1_tiles": base + 2500 + loop, "wg1_stored": base + 3000 + loop,
        }
        s.update(zip(PHASE_SLOTS, phases))
        return "work,%d,%d,%s" % (w, meta, ",".join(str(s[k]) for k in SLOTS + PHASE_SLOTS))

    lines.append(work(0, 0, 0, 1, 64, 1000, 500, 4000))   # 1 tile: loop 4 us, wait 1 us
    lines.append(work(1, 1, 0, 1, 64, 5000, 500, 6000))   # 1 tile: loop 6 us
    # A fold run: loop 20 us of 32 tiles, 0.1 / 0.3 / 0.2 us a tile by phase.
    lines.append(work(2, 0, 1, 32, 128, 9000, -500, 20000, (3200, 9600, 6400)))
    lines.append("work,3,0," + ",".join("0" for _ in SLOTS + PHASE_SLOTS))  # not stamped: skipped
    ctas, works = parse(lines)
    by_kind, counts, shares, rate = analyze(ctas, works)
    assert counts == {"1 tile, 64 q-rows": 2, "8+ tiles, 128 q-rows": 1}, counts
    assert abs(rate[0] - 1000.0) < 1e-9 and abs(rate[1] - 1000.0) < 1e-9, rate
    one = by_kind["1 tile, 64 q-rows"]
    assert one["wg0: tile loop"] == [4.0, 6.0], one["wg0: tile loop"]
    assert one["wg0: wait for the item"] == [1.0, 1.0], one["wg0: wait for the item"]
    assert one["item: gather (buffer free -> Q landed)"] == [1.0, 1.0]
    assert one["item: fields, rows, positions read"] == [0.5, 0.5]
    assert one["item: then waited for its buffer"] == [0.5, 0.5]
    assert one["wg0: item ready before asked (+) / waited (-)"] == [-0.5, -0.5]
    run = by_kind["8+ tiles, 128 q-rows"]
    assert run["wg0: wait for the item"] == [0.0], run["wg0: wait for the item"]
    assert run["wg0: store"] == [0.5]
    assert run["wg0 per tile: wait for the stage"] == [0.1], run
    assert run["wg0 per tile: MMAs issue -> done"] == [0.3], run
    assert run["wg0 per tile: release, fold, softmax"] == [0.2], run
    assert "wg0 per tile: wait for the stage" not in one  # no phases (a pair's): none shown
    # CTA 0 (span 39 us): wg0 asks at 2500 (1.5 us after the start), starts 3500, stores until
    # 8000, asks again at 11500 (3.5 us between works), stores until 32000 (8 us before the end);
    # CTA 1 (30 us): asks at 6500 (1.5 us), stores until 14000 (21 us before the end).
    total = sum(shares.values())
    assert abs(total - 69.0) < 1e-9, total  # both CTAs' spans
    assert abs(shares["tile loop"] - 30.0) < 1e-9, shares
    assert abs(shares["wait for the item"] - 2.0) < 1e-9, shares
    assert abs(shares["before the first work"] - 3.0) < 1e-9, shares
    assert abs(shares["between works"] - 3.5) < 1e-9, shares
    assert abs(shares["after the last work"] - 29.0) < 1e-9, shares
    assert report(ctas, works, out=open("/dev/null", "w")) == 0
    assert report({}, [], out=open("/dev/null", "w")) == 1
    print("ws_trace self-test: ok")
    return 0


# The persistent decode kernel's slots (attention_hopper.cuh DwTraceSlot), in file order.
DW_SLOTS = ["take", "taken", "rows", "full", "start", "stored", "tile0"]
# Then the row warp's tile loops by phase, cycles summed over the work's tiles (durations; 0 in
# traces before session 53 and in the decode-shaped form): (label, slot).
DW_PHASES = [
    ("consumer per tile: wait for it to land", "phase_wait"),
    ("consumer per tile: MMAs issue -> done", "phase_mma"),
    ("consumer per tile: release, fold, softmax", "phase_math"),
]
DW_INTERVALS = [
    ("item: take (buffer free -> index known)", "taken", "take"),
    ("item: index -> positions read", "rows", "taken"),
    ("item: positions -> Q landed", "full", "rows"),
    ("item: gather (buffer free -> Q landed)", "full", "take"),
    ("consumer: Q landed -> work started", "start", "full"),
    ("consumer: work (tiles and stores)", "stored", "start"),
    ("consumer: work started -> first tile landed", "tile0", "start"),
    ("consumer: first tile landed -> stored", "stored", "tile0"),
]


def parse_dw(lines):
    """Returns ({cta: (clock0, ns0, clock1, ns1)}, [work dicts]) of a DecodeWsKernel trace."""
    return parse_trace(lines, DW_SLOTS + [slot for _, slot in DW_PHASES], lambda meta: {
        "cta": meta & 0xFFF, "c": (meta >> 12) & 1, "j": (meta >> 13) & 0x7FFFF,
        "tiles": (meta >> 32) & 0xFFFF, "q": (meta >> 48) & 0xFFF,
    })


def analyze_dw(ctas, works):
    """Returns (per-kind {label: [us]}, per-kind counts, consumer time shares, cycles per us)."""
    rate = cycle_rates(ctas)
    by_kind, counts, per_consumer = intervals_by_kind(
        works, rate, DW_SLOTS, DW_INTERVALS,
        lambda w: "%d tile%s, %d q-rows" % (w["tiles"], "" if w["tiles"] == 1 else "s", w["q"]),
        lambda w: (w["cta"], w["c"]), DW_PHASES)
    shares = defaultdict(float)
    for (c, _), ws in per_consumer.items():
        r = rate[c]
        c0, _, c1, _ = ctas[c]
        shares["working"] += sum(w["stored"] - w["start"] for w in ws) / r
        shares["between works"] += sum(b["start"] - a["stored"] for a, b in zip(ws, ws[1:])) / r
        shares["before the first work"] += (ws[0]["start"] - c0) / r
        shares["after the last work"] += (c1 - ws[-1]["stored"]) / r
    return by_kind, counts, shares, rate


def report_dw(ctas, works, out=sys.stdout):
    by_kind, counts, shares, rate = analyze_dw(ctas, works)
    if not counts:
        print("ws_trace --dw: no complete work in the trace", file=out)
        return 1
    print_report(ctas, (by_kind, counts, shares, rate),
                 [i[0] for i in DW_INTERVALS] + [p[0] for p in DW_PHASES], 42, 4, "consumers'",
                 False, out)
    return 0


def self_test_dw():
    """A hand-made DecodeWsKernel trace: one CTA at 1000 cycles per us, its two consumers."""
    lines = ["cta,0,1000,0,21000,20000"]

    def work(w, c, j, tiles, base, loop, phases=(0, 0, 0)):
        meta = c << 12 | j << 13 | tiles << 32 | 2 << 48
        s = {"take": base, "taken": base + 500, "rows": base + 1500, "full": base + 2000,
             "start": base + 2500, "stored": base + 2500 + loop, "tile0": base + 3000}
        s.update(zip([slot for _, slot in DW_PHASES], phases))
        return "work,%d,%d,%s" % (
            w, meta, ",".join(str(s[k]) for k in DW_SLOTS + [slot for _, slot in DW_PHASES]))

    lines.append(work(0, 0, 0, 1, 1000, 3000))   # consumer 0: 3.5 -> 6.5 us
    lines.append(work(1, 0, 1, 1, 6000, 3000))   # consumer 0: 8.5 -> 11.5 (2 us between)
    # consumer 1: 3.5 -> 8.5; its 2 tiles waited 1.2 us, MMAs 0.8, the rest 2.0 (cycles summed)
    lines.append(work(2, 1, 0, 2, 1000, 5000, (1200, 800, 2000)))
    ctas, works = parse_dw(lines)
    by_kind, counts, shares, rate = analyze_dw(ctas, works)
    assert counts == {"1 tile, 2 q-rows": 2, "2 tiles, 2 q-rows": 1}, counts
    one = by_kind["1 tile, 2 q-rows"]
    assert one["item: take (buffer free -> index known)"] == [0.5, 0.5], one
    assert one["item: gather (buffer free -> Q landed)"] == [2.0, 2.0], one
    assert one["consumer: work (tiles and stores)"] == [3.0, 3.0], one
    assert one["consumer: work started -> first tile landed"] == [0.5, 0.5], one
    assert one["consumer: first tile landed -> stored"] == [2.5, 2.5], one
    assert "consumer per tile: wait for it to land" not in one, one  # no phases stamped
    two = by_kind["2 tiles, 2 q-rows"]
    assert two["consumer per tile: wait for it to land"] == [0.6], two   # 1200 cycles / 2 tiles
    assert two["consumer per tile: MMAs issue -> done"] == [0.4], two
    assert two["consumer per tile: release, fold, softmax"] == [1.0], two
    assert abs(shares["working"] - 11.0) < 1e-9, shares
    assert abs(shares["between works"] - 2.0) < 1e-9, shares
    assert abs(shares["before the first work"] - 5.0) < 1e-9, shares   # 2.5 us each
    assert abs(shares["after the last work"] - 22.0) < 1e-9, shares     # 9.5 + 12.5
    assert report_dw(ctas, works, out=open("/dev/null", "w")) == 0
    assert report_dw({}, [], out=open("/dev/null", "w")) == 1


def step_spans(kernels):
    """[(name, CTAs, (first, median, last) start, (first, median, last) end)] in microseconds of
    globaltimer from the earliest CTA start of any of `kernels` ([(name, {cta: (clock0, ns0,
    clock1, ns1)})]): where each kernel of a traced step ran. CTAs without an end are left out."""
    spans = [(name, [(t0, t1) for _, t0, _, t1 in ctas.values() if t1 > t0])
             for name, ctas in kernels]
    starts = [t0 for _, ts in spans for t0, _ in ts]
    if not starts:
        return []
    origin = min(starts)
    out = []
    for name, ts in spans:
        if not ts:
            continue
        b = sorted((t0 - origin) / 1000.0 for t0, _ in ts)
        e = sorted((t1 - origin) / 1000.0 for _, t1 in ts)
        out.append((name, len(ts), (b[0], statistics.median(b), b[-1]),
                    (e[0], statistics.median(e), e[-1])))
    return out


def report_step(kernels, out=sys.stdout):
    spans = step_spans(kernels)
    if not spans:
        print("ws_trace --step: no CTA with a start and an end", file=out)
        return 1
    print("\nthe step's kernels (us from the first CTA start, globaltimer; first / median / last):",
          file=out)
    for name, n, b, e in spans:
        print("  %-28s %4d CTAs  start %6.1f / %6.1f / %6.1f  end %6.1f / %6.1f / %6.1f"
              % ((name, n) + b + e), file=out)
    return 0


def self_test_step():
    wide = {0: (0, 1000, 0, 31000), 1: (0, 1500, 0, 2500), 2: (0, 2000, 0, 30000)}
    dw = {0: (0, 32000, 0, 45000), 1: (0, 3000, 0, 44000), 2: (0, 0, 0, 0)}  # 2: no end
    spans = step_spans([("wide kernel", wide), ("decode kernel", dw)])
    assert spans[0] == ("wide kernel", 3, (0.0, 0.5, 1.0), (1.5, 29.0, 30.0)), spans
    assert spans[1] == ("decode kernel", 2, (2.0, 16.5, 31.0), (43.0, 43.5, 44.0)), spans
    assert report_step([("wide kernel", wide)], out=open("/dev/null", "w")) == 0
    assert report_step([("wide kernel", {})], out=open("/dev/null", "w")) == 1


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        self_test_dw()
        self_test_step()
        return self_test()
    if len(argv) == 3 and argv[1] == "--step":  # FILE (the wide kernel's) and FILE.dw if there
        kernels = []
        for name, path, parser in (("wide kernel", argv[2], parse),
                                   ("decode kernel (own tiles)", argv[2] + ".dw", parse_dw)):
            try:
                with open(path) as f:
                    kernels.append((name, parser(f)[0]))
            except FileNotFoundError:
                pass
        return report_step(kernels)
    if len(argv) == 3 and argv[1] == "--dw":
        with open(argv[2]) as f:
            ctas, works = parse_dw(f)
        return report_dw(ctas, works)
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        ctas, works = parse(f)
    return report(ctas, works)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
