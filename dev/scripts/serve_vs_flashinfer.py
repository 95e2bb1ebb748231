#!/usr/bin/env python3
"""kvrope_bench's serve-suite times beside bench/flashinfer_compare.py's FlashInfer times, case by case.

For a run where kvrope's figures come from kvrope_bench (a variant build, for instance) and FlashInfer's from the
comparison of the same call: both take the CUPTI kernel span, L2 flushed before each call, median of 50. Prints
each case with FlashInfer's fused bf16 (FI fused), fused fp8 (FI fp8) and rope + append (FI r+a) times, kvrope's
(k read only) and its ratios to FlashInfer's fastest single launch (FI1) and to its two launches (FI2), then the
geomeans and the worst ratios.

    python3 dev/scripts/serve_vs_flashinfer.py FLASHINFER_COMPARE.log SERVE_DECODE.log SERVE_PREFILL.log [--plot PNG]

--plot draws each suite's cases (log scale): kvrope, FlashInfer's fastest single launch and its rope + append as
bars, the floor as a dash (needs matplotlib).
"""
import math
import re
import sys


def table(path, pattern):
    """The first match of `pattern` a case, keyed by its (suite, case) or (None, case)."""
    rows = {}
    for line in open(path):
        m = re.match(pattern, line)
        if m:
            rows.setdefault((m.groupdict().get("suite"), int(m.group("case"))), m)
    return rows


def num(s):
    return None if s.strip() == "-" else float(s)


def main(fi_log, *bench_logs):
    fi = table(fi_log, r"(?P<suite>serve-(?:decode|prefill)) +(?P<case>\d+) +(?P<shape>\S+) +(?P<hq>\d+) +(?P<cache>\S+)"
               r" +(?P<lay>\S+) +(?P<mb>[\d.]+) \| +(?P<fused>\S+) +(?P<fp8>\S+) +(?P<two>\S+) \|")
    out = []
    for log in bench_logs:
        suite = "serve-decode" if "suite serve-decode" in open(log).read() else "serve-prefill"
        row = r" *(?P<case>\d+) +\S+ +\d+ +\S+ +\S+ \| +(?P<kv>[\d.]+) +\S+ +\S+ \| +(?P<floor>[\d.]+) "
        for (_, case), m in table(log, row).items():
            out.append((suite, case, fi[(suite, case)], float(m.group("kv")), float(m.group("floor"))))
    print(f"{'suite':13} {'case':>4} {'shape':>7} {'Hq':>3} {'cache':>8} {'lay':>3} | {'FI fused':>8} {'FI fp8':>8}"
          f" {'FI r+a':>8} | {'kvrope':>8} | {'k/FI1':>6} {'k/FI2':>6}")
    ratios = {}
    for suite, case, f, kv, _ in out:
        fused, fp8, two = num(f.group("fused")), num(f.group("fp8")), num(f.group("two"))
        single = min(x for x in (fused, fp8) if x is not None) if (fused or fp8) else None
        r1 = kv / single if single else None
        r2 = kv / two if two else None
        ratios.setdefault(suite, []).append((case, r1, r2, kv))
        cell = lambda x: f"{x:8.2f}" if x is not None else f"{'-':>8}"
        rc = lambda x: f"{x:6.3f}" if x is not None else f"{'-':>6}"
        print(f"{suite:13} {case:4d} {f.group('shape'):>7} {f.group('hq'):>3} {f.group('cache'):>8} {f.group('lay'):>3} |"
              f" {cell(fused)} {cell(fp8)} {cell(two)} | {kv:8.2f} | {rc(r1)} {rc(r2)}")
    print()
    for suite, rs in ratios.items():
        g = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))
        r1 = [r for _, r, _, _ in rs if r is not None]
        r2 = [r for _, _, r, _ in rs if r is not None]
        print(f"{suite} kvrope / FlashInfer single launch geomean = {g(r1):.3f} (over {len(r1)} cases), "
              f"range {min(r1):.3f}-{max(r1):.3f}")
        print(f"{suite} kvrope / FlashInfer rope+append geomean = {g(r2):.3f} (over {len(r2)} cases), "
              f"range {min(r2):.3f}-{max(r2):.3f}")
        print(f"{suite} kvrope geomean us = {g([kv for *_, kv in rs]):.2f} (over {len(rs)} cases)")
    return out


def plot(out, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = sorted({o[0] for o in out})
    fig, axes = plt.subplots(len(suites), 1, figsize=(16, 5 * len(suites)))
    for ax, suite in zip(axes if len(suites) > 1 else [axes], suites):
        rows = sorted((o for o in out if o[0] == suite), key=lambda o: o[1])
        x = range(len(rows))
        fused = [num(r[2].group("fused")) for r in rows]
        fp8 = [num(r[2].group("fp8")) for r in rows]
        single = [min(v for v in (a, b) if v is not None) if (a or b) else 0 for a, b in zip(fused, fp8)]
        two = [num(r[2].group("two")) or 0 for r in rows]
        w = 0.27
        ax.bar([i - w for i in x], [r[3] for r in rows], w, label="kvrope (one launch)", color="#4c72b0", zorder=2)
        ax.bar(list(x), single, w, label="FlashInfer fused (bf16 Hq 64 NHD) or fused fp8", color="#dd8452", zorder=2)
        ax.bar([i + w for i in x], two, w, label="FlashInfer rope + append (two launches)", color="#55a868", zorder=2)
        ax.hlines([r[4] for r in rows], [i - 1.5 * w for i in x], [i + 1.5 * w for i in x], colors="black",
                  label="floor", zorder=3)
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{r[1]}: {r[2].group('shape')} {r[2].group('hq')} {r[2].group('cache').replace('fp8_', '')} {r[2].group('lay')}"
                            for r in rows], fontsize=7, rotation=90)
        ax.set_ylabel("us (CUPTI span, L2 flushed, median of 50)")
        ax.set_title(f"{suite}: kvrope against FlashInfer 0.7.4 on an H200")
        ax.grid(axis="y", which="both", alpha=0.3, zorder=0)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    args = sys.argv[1:]
    png = None
    if "--plot" in args:
        i = args.index("--plot")
        png = args[i + 1]
        del args[i : i + 2]
    rows = main(*args)
    if png:
        plot(rows, png)
