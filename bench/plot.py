#!/usr/bin/env python3
"""Plots kvrope_bench's JSON results (--kvrope_json): time per case, log scale.

    python3 bench/plot.py kvrope_bench_results.json docs/benchmarks_h200.png

Bars: the CUPTI median of each variant that ran (naive, fused, in-place); dashes: the floor of the
out-of-place op (black) and of the in-place op (grey) over each case's group.
"""
import argparse
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [  # (variant key in the JSON, legend label, colour)
    ("naive", "naive reference", "#c44e52"),
    ("fused", "fused, out-of-place", "#4c72b0"),
    ("inplace", "fused, in-place", "#55a868"),
]


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="results written by kvrope_bench --kvrope_json=...")
    parser.add_argument("png", help="image to write, e.g. docs/benchmarks_h200.png")
    args = parser.parse_args(argv)

    with open(args.json) as f:
        results = json.load(f)
    cases = sorted(results.get("cases", []), key=lambda c: c["case"])
    if not cases:
        sys.exit(f"{args.json}: no case results")

    present = [s for s in SERIES if any(s[0] in c["variants"] for c in cases)]
    n = len(cases)
    width = 0.8 / max(len(present), 1)
    xs = list(range(n))

    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * n + 2.0), 5.0))
    for i, (key, label, colour) in enumerate(present):
        offset = (i - (len(present) - 1) / 2) * width
        pts = [(x + offset, c["variants"][key]["median_us"]) for x, c in zip(xs, cases) if key in c["variants"]]
        g = geomean([y for _, y in pts])
        ax.bar([p[0] for p in pts], [p[1] for p in pts], width=width * 0.95, color=colour,
               label=f"{label} (geomean {g:.1f} us)" if g else label, zorder=2)

    half = 0.42
    for key, label, style in (("floor_us", "floor, out-of-place", dict(color="black", linestyle="-")),
                              ("inplace_floor_us", "floor, in-place", dict(color="0.45", linestyle="--"))):
        if not any(key in c for c in cases):
            continue
        g = geomean([c.get(key) for c in cases])
        for j, (x, c) in enumerate(zip(xs, cases)):
            if c.get(key):
                ax.hlines(c[key], x - half, x + half, linewidth=1.6, zorder=3,
                          label=(f"{label} (geomean {g:.1f} us)" if j == 0 else None), **style)

    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{c['case']}\nB{c['batch']} S{c['seq_len']}\nSmax{c['cache_len']}" for c in cases],
                       fontsize=7)
    ax.set_xlabel("case (bench/sol_execbench_062_cases.csv)")
    ax.set_ylabel("time per call, us (CUPTI median, L2 flushed)")
    ax.grid(axis="y", which="both", alpha=0.3, zorder=0)

    device = results.get("device", {}).get("name", "unknown GPU")
    cfg = results.get("config", {})
    geo = results.get("geomean", {})
    subtitle = f"{cfg.get('dtype', '?')}, H={cfg.get('heads', '?')}, D={cfg.get('head_dim', '?')}, " \
               f"positions {cfg.get('positions', '?')}"
    if geo.get("fused_over_floor"):
        subtitle += f"; fused/floor geomean {geo['fused_over_floor']:.3f}"
    if geo.get("naive_over_fused"):
        subtitle += f", naive/fused {geo['naive_over_fused']:.1f}x"
    ax.set_title(f"kvrope backward on {device}\n{subtitle}", fontsize=10)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 12)  # headroom for the legend above the tallest bars
    ax.legend(fontsize=8, loc="upper center", ncol=3, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=150)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main(sys.argv[1:])
