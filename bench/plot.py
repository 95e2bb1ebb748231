#!/usr/bin/env python3
"""Plots kvrope_bench's JSON results (--kvrope_json): time per case, log scale.

    python3 bench/plot.py kvrope_bench_results.json docs/benchmarks_h200.png
    python3 bench/plot.py fwd_forward.json docs/benchmarks_h200_forward.png

Backward (the leaderboard suite): bars are the CUPTI median of each variant that ran (naive, fused,
in-place); dashes are the floor of the out-of-place op (black) and of the in-place op (grey) over
each case's group.

Forward suites (--suite=forward, decode or styles, told by the JSON's config.suite): bars are the
CUPTI median of each variant in the JSON (fwd, fwd_naive; or half, interleaved, half_r64); dashes
are the floors, one line for the variants that share a floor (styles: half_r64 has its own). The
decode suite adds a dotted line at floor + one empty kernel, the measure of its target.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [  # backward: (variant key in the JSON, legend label, colour)
    ("naive", "naive reference", "#c44e52"),
    ("fused", "fused, out-of-place", "#4c72b0"),
    ("inplace", "fused, in-place", "#55a868"),
]

FORWARD_SUITES = ("forward", "decode", "styles")
FORWARD_SERIES = {  # forward: variant key -> (legend label, colour)
    "fwd": ("fused forward", "#4c72b0"),
    "fwd_naive": ("naive reference (Hugging Face's steps)", "#c44e52"),
    "half": ("rotate-half, R = D", "#4c72b0"),
    "interleaved": ("interleaved, R = D", "#dd8452"),
    "half_r64": ("rotate-half, R = D / 2", "#55a868"),
}
OTHER_COLOURS = ["#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]
FLOOR_STYLES = [dict(color="black", linestyle="-"), dict(color="0.45", linestyle="--"),
                dict(color="0.25", linestyle="-."), dict(color="0.6", linestyle=":")]


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def draw_bars(ax, cases, present):
    """present: [(key, label, colour)]; one bar per case and variant, grouped by case."""
    width = 0.8 / max(len(present), 1)
    for i, (key, label, colour) in enumerate(present):
        offset = (i - (len(present) - 1) / 2) * width
        pts = [(x + offset, c["variants"][key]["median_us"]) for x, c in enumerate(cases) if key in c["variants"]]
        g = geomean([y for _, y in pts])
        ax.bar([p[0] for p in pts], [p[1] for p in pts], width=width * 0.95, color=colour,
               label=f"{label} (geomean {g:.1f} us)" if g else label, zorder=2)


def draw_dashes(ax, values, label, style):
    """values: one floor per case (None: no dash); a dash over each case's group of bars."""
    half = 0.42
    g = geomean(values)
    first = True
    for x, v in enumerate(values):
        if v:
            ax.hlines(v, x - half, x + half, linewidth=1.6, zorder=3,
                      label=(f"{label} (geomean {g:.2f} us)" if first else None), **style)
            first = False


def plot_backward(ax, results, cases):
    present = [s for s in SERIES if any(s[0] in c["variants"] for c in cases)]
    draw_bars(ax, cases, present)
    half = 0.42
    for key, label, style in (("floor_us", "floor, out-of-place", dict(color="black", linestyle="-")),
                              ("inplace_floor_us", "floor, in-place", dict(color="0.45", linestyle="--"))):
        if not any(key in c for c in cases):
            continue
        g = geomean([c.get(key) for c in cases])
        for j, (x, c) in enumerate(enumerate(cases)):
            if c.get(key):
                ax.hlines(c[key], x - half, x + half, linewidth=1.6, zorder=3,
                          label=(f"{label} (geomean {g:.1f} us)" if j == 0 else None), **style)
    geo = results.get("geomean", {})
    subtitle = ""
    if geo.get("fused_over_floor"):
        subtitle += f"; fused/floor geomean {geo['fused_over_floor']:.3f}"
    if geo.get("naive_over_fused"):
        subtitle += f", naive/fused {geo['naive_over_fused']:.1f}x"
    return "kvrope backward", subtitle, len(present) + 2


def same_floors(a, b):
    return all((x is None) == (y is None) and (x is None or abs(x - y) <= 1e-6 * max(abs(x), 1.0))
               for x, y in zip(a, b))


def plot_forward(ax, results, cases, suite):
    cfg = results.get("config", {})
    keys = [k for k in cfg.get("variants", []) if any(k in c["variants"] for c in cases)]
    for c in cases:  # variants in the cases but not in config.variants, in order of appearance
        keys += [k for k in c["variants"] if k not in keys]
    present = []
    for i, key in enumerate(keys):
        label, colour = FORWARD_SERIES.get(key, (key, OTHER_COLOURS[i % len(OTHER_COLOURS)]))
        present.append((key, label, colour))
    draw_bars(ax, cases, present)

    # One dash line per distinct floor (the variants of the same bytes share one).
    groups = []  # [(keys, floors)]
    for key in keys:
        floors = [c["variants"][key].get("floor_us") if key in c["variants"] else None for c in cases]
        for names, fl in groups:
            if same_floors(fl, floors):
                names.append(key)
                break
        else:
            groups.append(([key], floors))
    for i, (names, floors) in enumerate(groups):
        draw_dashes(ax, floors, "floor" if len(groups) == 1 else f"floor of {', '.join(names)}",
                    FLOOR_STYLES[i % len(FLOOR_STYLES)])
    lines = len(present) + len(groups)
    empty = results.get("calibration", {}).get("empty_kernel_us")
    if suite == "decode" and empty and groups:
        draw_dashes(ax, [f + empty if f else None for f in groups[0][1]], f"floor + empty kernel ({empty:.2f} us)",
                    dict(color="black", linestyle=":"))
        lines += 1

    geo = results.get("geomean", {})
    parts = []
    if keys and geo.get(f"{keys[0]}_over_floor"):
        parts.append(f"{keys[0]}/floor geomean {geo[keys[0] + '_over_floor']:.3f}")
    if keys and geo.get(f"{keys[0]}_over_floor_plus_empty"):
        parts.append(f"{keys[0]}/(floor + empty) geomean {geo[keys[0] + '_over_floor_plus_empty']:.3f}")
    for a in keys:  # ratios between variants, as the bench prints them
        for b in keys:
            if a != b and geo.get(f"{a}_over_{b}"):
                ratio = geo[f"{a}_over_{b}"]
                parts.append(f"{a}/{b} {ratio:.1f}x" if ratio >= 2 else f"{a}/{b} {ratio:.3f}")
    call = "key_out on" if cfg.get("key_out") else "no key_out"
    if cfg.get("query_heads"):
        call += f", q {cfg['query_heads']} heads"
    sep = ";\n" if len(cases) < 10 else "; "  # a narrow figure: the ratios on a line of their own
    subtitle = f", {call}" + (sep + ", ".join(parts) if parts else "")
    return f"kvrope forward (--suite={suite})", subtitle, lines


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

    cfg = results.get("config", {})
    suite = cfg.get("suite", "leaderboard")  # the JSON of the suites up to v17 has no config.suite
    n = len(cases)
    xs = list(range(n))
    fig, ax = plt.subplots(figsize=(max(10.0, 0.75 * n + 2.0), 5.0))
    if suite in FORWARD_SUITES:
        what, extra, lines = plot_forward(ax, results, cases, suite)
    else:
        what, extra, lines = plot_backward(ax, results, cases)

    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{c['case']}\nB{c['batch']} S{c['seq_len']}\nSmax{c['cache_len']}" for c in cases],
                       fontsize=7)
    table = os.path.basename(cfg.get("cases_csv", "")) or "sol_execbench_062_cases.csv"
    ax.set_xlabel(f"case (bench/{table})")
    ax.set_ylabel("time per call, us (CUPTI median, L2 flushed)")
    ax.grid(axis="y", which="both", alpha=0.3, zorder=0)

    device = results.get("device", {}).get("name", "unknown GPU")
    subtitle = f"{cfg.get('dtype', '?')}, H={cfg.get('heads', '?')}, D={cfg.get('head_dim', '?')}, " \
               f"positions {cfg.get('positions', '?')}" + extra
    ax.set_title(f"{what} on {device}\n{subtitle}", fontsize=10)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (12 if lines <= 6 else 40))  # headroom for the legend above the tallest bars
    ax.legend(fontsize=8, loc="upper center", ncol=3 if n >= 10 else 2, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=150)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main(sys.argv[1:])
