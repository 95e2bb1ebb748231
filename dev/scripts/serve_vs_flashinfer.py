#!/usr/bin/env python3
"""kvrope_bench's serve-suite times beside bench/flashinfer_compare.py's FlashInfer times, case by case.

For a run where kvrope's figures come from kvrope_bench (a variant build, for instance) and FlashInfer's from the
comparison of the same call: both take the CUPTI kernel span, L2 flushed before each call, median of 50. Prints
each case with FlashInfer's fused bf16 (FI fused), fused fp8 (FI fp8) and rope + append (FI r+a) times, kvrope's
(k read only) and its ratios to FlashInfer's fastest single launch (FI1) and to its two launches (FI2), then the
geomeans and the worst ratios.

The NVFP4 cases (cache nvfp4) are set against FlashInfer's rope + NVFP4 append pair (FI r+fp4, their FI2);
the mRoPE cases (cache bf16+mrope) against nothing (FlashInfer has no mRoPE kernel); the MLA cases (cache mla_bf16,
mla_fp8+q8) against its rope + append_paged_mla_kv_cache pair (FI r+a) and its fp8 kernel in MLA mode (FI fp8).
The geomean lines of old cover the cases of old (neither NVFP4, mRoPE nor MLA), so that they compare with earlier
runs; each new group's lines follow, headed "SUITE nvfp4:", "SUITE mrope:" or "SUITE mla:".

Then, per suite, kvrope against FlashInfer doing the same work (the "same work" lines): its fused bf16 kernel
on the bf16 cases it applies to (Hq 64 NHD), its fused fp8 kernel on the q-fp8 cases (cache fp8_e4m3+q8: q
written in fp8 by both), its rope + append pair on the other bf16 cases, its rope + NVFP4 append pair on the
NVFP4 cases; the fp8-cache cases with q in bf16 have no FlashInfer counterpart (its fp8 kernel writes q in
fp8), nor the mRoPE cases, and are left out. Geomean and max of kvrope / that time, and the kind by kind
geomeans; kvrope's time / (floor + one empty kernel) for decode (the bench log's k/(fl+em) column) and time /
floor for prefill cases of 64 MB or more (k/fl), geomean and max; and for decode T <= 32, kvrope's q-fp8 case
minus its bf16 twin (same T, Hq, layout), in us, beside FlashInfer's same-work difference. Each group apart, as
above. A bench case missing from the FlashInfer log (an older log) is listed and left out.

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
    # FI r+fp4 (the NVFP4 pair) is the fourth FlashInfer column of logs since the NVFP4 cases; older logs have three.
    fi = table(fi_log, r"(?P<suite>serve-(?:decode|prefill)) +(?P<case>\d+) +(?P<shape>\S+) +(?P<hq>\d+) +(?P<cache>\S+)"
               r" +(?P<lay>\S+) +(?P<mb>[\d.]+) \| +(?P<fused>\S+) +(?P<fp8>\S+) +(?P<two>\S+)(?: +(?P<fp4>\S+))? \|")
    out = []
    extra = {}  # (suite, case): the bench row's MB, k/fl and (decode) k/(fl+em) columns
    missing = []
    for log in bench_logs:
        suite = "serve-decode" if "suite serve-decode" in open(log).read() else "serve-prefill"
        # kvrope_bench's summary row: case shape Hq cache lay | kvrope kip naive | floor fl_kip MB | k/fl kip/flk
        # n/flk n/k [k/(fl+em), decode only] | ...
        row = (r" *(?P<case>\d+) +(?P<shape>\S+) +(?P<hq>\d+) +(?P<cache>\S+) +(?P<lay>\S+)"
               r" \| +(?P<kv>[\d.]+) +\S+ +\S+"
               r" \| +(?P<floor>[\d.]+) +\S+ +(?P<mb>[\d.]+)"
               r" \| +(?P<kfl>\S+) +\S+ +\S+ +\S+(?: +(?P<kfle>\S+))? \|")
        for (_, case), m in table(log, row).items():
            f = fi.get((suite, case))
            if f is None:
                missing.append((suite, case, ""))
                continue
            if (f.group("shape"), f.group("hq"), f.group("cache"), f.group("lay")) != (
                    m.group("shape"), m.group("hq"), m.group("cache"), m.group("lay")):
                missing.append((suite, case, f" (FlashInfer's case {case} is another: {f.group('shape')} Hq "
                                             f"{f.group('hq')} {f.group('cache')} {f.group('lay')})"))
                continue
            out.append((suite, case, f, float(m.group("kv")), float(m.group("floor"))))
            extra[(suite, case)] = (float(m.group("mb")), float(m.group("kfl")),
                                    float(m.group("kfle")) if m.group("kfle") else None)
    print(f"{'suite':13} {'case':>4} {'shape':>7} {'Hq':>3} {'cache':>8} {'lay':>3} | {'FI fused':>8} {'FI fp8':>8}"
          f" {'FI r+a':>8} {'FI r+fp4':>8} | {'kvrope':>8} | {'k/FI1':>6} {'k/FI2':>6}")
    ratios = {}
    for suite, case, f, kv, _ in out:
        fused, fp8, two, fp4 = num(f.group("fused")), num(f.group("fp8")), num(f.group("two")), fp4_of(f)
        single = min(x for x in (fused, fp8) if x is not None) if (fused or fp8) else None
        pair = fp4 if f.group("cache") == "nvfp4" else two  # FI2: the pair of the case's cache
        r1 = kv / single if single else None
        r2 = kv / pair if pair else None
        ratios.setdefault((suite, group(f)), []).append((case, r1, r2, kv))
        cell = lambda x: f"{x:8.2f}" if x is not None else f"{'-':>8}"
        rc = lambda x: f"{x:6.3f}" if x is not None else f"{'-':>6}"
        print(f"{suite:13} {case:4d} {f.group('shape'):>7} {f.group('hq'):>3} {f.group('cache'):>8} {f.group('lay'):>3} |"
              f" {cell(fused)} {cell(fp8)} {cell(two)} {cell(fp4)} | {kv:8.2f} | {rc(r1)} {rc(r2)}")
    print()
    g = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))
    for (suite, grp), rs in ratios.items():
        # The lines of old over the cases of old; the NVFP4 and mRoPE groups' with their name.
        name = suite if grp == "base" else f"{suite} {grp}:"
        r1 = [r for _, r, _, _ in rs if r is not None]
        r2 = [r for _, _, r, _ in rs if r is not None]
        pair = {"nvfp4": "rope+nvfp4 append", "mla": "rope+mla append"}.get(grp, "rope+append")
        if r1:
            print(f"{name} kvrope / FlashInfer single launch geomean = {g(r1):.3f} (over {len(r1)} cases), "
                  f"range {min(r1):.3f}-{max(r1):.3f}")
        if r2:
            print(f"{name} kvrope / FlashInfer {pair} geomean = {g(r2):.3f} (over {len(r2)} cases), "
                  f"range {min(r2):.3f}-{max(r2):.3f}")
        print(f"{name} kvrope geomean us = {g([kv for *_, kv in rs]):.2f} (over {len(rs)} cases)")
    if missing:
        print("left out (no matching FlashInfer row): " +
              "; ".join(f"{suite} {', '.join(id_ranges([c for s, c, _ in missing if s == suite]))}"
                        for suite in sorted({s for s, _, _ in missing})) +
              "".join(f"; {suite} {case}{why}" for suite, case, why in missing if why))
    same_work_summary(out, extra)
    return out


def fp4_of(f):
    """The FI r+fp4 column of a FlashInfer row (None in older logs, which lack it, or where "-")."""
    return num(f.group("fp4")) if f.group("fp4") is not None else None


def group(f):
    """A row's group by its cache label: "nvfp4", "mrope" (bf16+mrope), "mla" (mla_bf16, mla_fp8+q8), or "base"
    (the cases of old)."""
    cache = f.group("cache")
    if cache.startswith("mla"):
        return "mla"
    return "nvfp4" if cache == "nvfp4" else "mrope" if cache.endswith("+mrope") else "base"


def id_ranges(ids):
    """Case ids as runs: [1, 2, 3, 7] -> ["1-3", "7"]."""
    runs = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [f"{a}-{b}" if b > a else f"{a}" for a, b in runs]


def same_work(f):
    """FlashInfer's launch doing a case's work, as (time, kind), or (None, why): its fused bf16 kernel where
    timed (bf16, Hq 64 NHD), its fused fp8 kernel on the q-fp8 cases, its rope + append pair on the other bf16
    cases, its rope + NVFP4 append pair on the NVFP4 cases; MLA: its fp8 kernel in MLA mode (mla_fp8+q8), its rope +
    MLA append pair (mla_bf16); none for the fp8-cache cases with q in bf16, nor for the mRoPE cases."""
    cache = f.group("cache")
    fused, fp8, two = num(f.group("fused")), num(f.group("fp8")), num(f.group("two"))
    if cache == "mla_bf16":
        return two, "rope+mla append"
    if cache.endswith("+q8"):
        return fp8, "fp8 kernel"
    if cache.endswith("+mrope"):
        return None, "none (FlashInfer has no mRoPE)"
    if cache == "nvfp4":
        return fp4_of(f), "rope+nvfp4 append"
    if cache == "bf16":
        return (fused, "fused bf16") if fused is not None else (two, "rope+append")
    return None, "none (q in bf16, fp8 cache)"


def same_work_summary(out, extra):
    """The "same work" lines (the module docstring), per suite: the cases of old first (the lines of old), then
    the NVFP4, mRoPE and MLA groups' under their name."""
    print()
    for suite in sorted({o[0] for o in out}):
        for grp in ("base", "nvfp4", "mrope", "mla"):
            rows = [o for o in out if o[0] == suite and group(o[2]) == grp]
            if rows:
                same_work_lines(suite if grp == "base" else f"{suite} {grp}:", suite, rows, extra, grp == "base")


def same_work_lines(name, suite, rows, extra, twins):
    """One group's "same work" lines, each headed `name`; with `twins`, decode's q-fp8 minus bf16 lines."""
    g = lambda v: math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")
    ratios, kinds = [], {}
    for _, case, f, kv, _ in rows:
        t, kind = same_work(f)
        if t:
            ratios.append((kv / t, case))
            kinds.setdefault(kind, []).append(kv / t)
    if ratios:
        worst = max(ratios)
        print(f"{name} kvrope / FlashInfer same work geomean = {g([r for r, _ in ratios]):.3f} "
              f"(over {len(ratios)} of {len(rows)} cases), max = {worst[0]:.3f} (case {worst[1]})")
        print(f"{name} kvrope / FlashInfer same work by kind: " +
              "; ".join(f"{k} {g(v):.3f} geomean, {max(v):.3f} max ({len(v)} cases)" for k, v in kinds.items()))
    if suite == "serve-decode":
        xe = [(extra[(suite, case)][2], case) for _, case, *_ in rows if extra[(suite, case)][2] is not None]
        if xe:
            worst = max(xe)
            print(f"{name} kvrope / (floor + empty kernel) geomean = {g([x for x, _ in xe]):.3f} (over {len(xe)} "
                  f"cases), max = {worst[0]:.3f} (case {worst[1]})")
    else:
        xl = [(extra[(suite, case)][1], case) for _, case, *_ in rows if extra[(suite, case)][0] >= 64.0]
        if xl:
            worst = max(xl)
            print(f"{name} kvrope / floor geomean (>= 64 MB) = {g([x for x, _ in xl]):.3f} "
                  f"(over {len(xl)} cases), max = {worst[0]:.3f} (case {worst[1]})")
    if suite != "serve-decode" or not twins:
        return
    # T <= 32: the q-fp8 case against its bf16 twin (same T, Hq, layout).
    bf16 = {(f.group("shape"), f.group("hq"), f.group("lay")): (case, f, kv) for _, case, f, kv, _ in rows
            if f.group("cache") == "bf16"}
    for _, case, f, kv, _ in rows:
        key = (f.group("shape"), f.group("hq"), f.group("lay"))
        if not f.group("cache").endswith("+q8") or int(f.group("shape").split("=")[1]) > 32 or key not in bf16:
            continue
        twin, fb, kvb = bf16[key]
        fi_q8, fi_b = same_work(f)[0], same_work(fb)[0]
        fi_diff = f"{fi_q8 - fi_b:+.2f} us ({fi_q8:.2f} - {fi_b:.2f})" if fi_q8 and fi_b else "-"
        print(f"{suite} {key[0]} Hq {key[1]} {key[2]}: q-fp8 minus bf16 (case {case} - case {twin}): kvrope "
              f"{kv - kvb:+.2f} us ({kv:.2f} - {kvb:.2f}); FlashInfer same work {fi_diff}")


def gpu_of(log):
    """The GPU a kvrope_bench log ran on, from its first line ("kvrope_bench: NAME (sm_90), ...")."""
    for line in open(log):
        m = re.match(r"kvrope_bench: (.+?) \(sm_", line)
        if m:
            return m.group(1)
    return "an unnamed GPU"


def plot(out, path, gpu):
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
        two = [(fp4_of(r[2]) if r[2].group("cache") == "nvfp4" else num(r[2].group("two"))) or 0 for r in rows]
        w = 0.27
        ax.bar([i - w for i in x], [r[3] for r in rows], w, label="kvrope (one launch)", color="#4c72b0", zorder=2)
        ax.bar(list(x), single, w, label="FlashInfer fused (bf16 Hq 64 NHD) or fused fp8", color="#dd8452", zorder=2)
        ax.bar([i + w for i in x], two, w, label="FlashInfer rope + append (NVFP4: rope + nvfp4 append)",
               color="#55a868", zorder=2)
        ax.hlines([r[4] for r in rows], [i - 1.5 * w for i in x], [i + 1.5 * w for i in x], colors="black",
                  label="floor", zorder=3)
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{r[1]}: {r[2].group('shape')} {r[2].group('hq')} {r[2].group('cache').replace('fp8_', '')} {r[2].group('lay')}"
                            for r in rows], fontsize=7, rotation=90)
        ax.set_ylabel("us (CUPTI span, L2 flushed, median of 50)")
        ax.set_title(f"{suite}: kvrope against FlashInfer 0.7.4 on {gpu}")
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
        plot(rows, png, gpu_of(args[1]))
