#!/usr/bin/env python3
"""kvrope's torch ops against PyTorch on the 16 leaderboard shapes (bench/sol_execbench_062_cases.csv;
H = 8, D = 128, bf16, cache_position = arange(S), tables [B, S, D]): the eager reference, torch.compile
of it and the kvrope ops, for the backward (out of place and in place) and the forward (in place,
RoPE(k) returned). Each call runs after an L2 flush (a write of twice the L2) and a synchronize; after
an untimed pass over every case, it is timed by CUDA events (launch and the host's time in the call
included) in a pass over every case before the profiler ever starts, and by its GPU kernel span from
CUPTI through torch.profiler in a last pass (first kernel start to last kernel end, the flush's
kernels and in-place calls' fresh copies left out). Medians of --iters calls.

    python3 bench/torch_compare.py [--iters 30] [--cases 1,2,...] [--json out.json]
"""
import argparse
import csv
import json
import math
import os
import statistics

import torch

import kvrope_torch

HERE = os.path.dirname(os.path.abspath(__file__))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_half_adjoint(g):
    h = g.shape[-1] // 2
    return torch.cat((g[..., h:], -g[..., :h]), dim=-1)


# --- the reference steps, as PyTorch eager runs them ------------------------------------------------

def eager_backward(gk_cache, gv_cache, k, cos, sin, pos):
    g, gv = gk_cache[:, :, pos], gv_cache[:, :, pos]
    c, s = cos[:, None], sin[:, None]
    gk = g * c + rotate_half_adjoint(g * s)
    gcos, gsin = (g * k).sum(1), (g * rotate_half(k)).sum(1)
    gkc, gvc = gk_cache.index_fill(2, pos, 0), gv_cache.index_fill(2, pos, 0)
    return gk, gv, gcos, gsin, gkc, gvc


def eager_backward_(gk_cache, gv_cache, k, cos, sin, pos):
    g, gv = gk_cache[:, :, pos], gv_cache[:, :, pos]
    c, s = cos[:, None], sin[:, None]
    gk = g * c + rotate_half_adjoint(g * s)
    gcos, gsin = (g * k).sum(1), (g * rotate_half(k)).sum(1)
    gk_cache.index_fill_(2, pos, 0)
    gv_cache.index_fill_(2, pos, 0)
    return gk, gv, gcos, gsin


def eager_forward_(k, v, k_cache, v_cache, cos, sin, pos):  # apply_rotary_pos_emb, then StaticCache.update
    k_rot = k * cos[:, None] + rotate_half(k) * sin[:, None]
    k_cache.index_copy_(2, pos, k_rot)
    v_cache.index_copy_(2, pos, v)
    return k_rot


# --- the clock ---------------------------------------------------------------------------------------

class Clock:
    """The protocol of docs/spec.md section 5.3 from Python: before each timed call, prepare() (untimed),
    an L2 flush (a write of twice the L2, new values each call) and a synchronize. event() times calls by
    CUDA events with the profiler never started: once torch.profiler has run in a process, the host's
    CUDA calls cost more (docs/benchmarks.md, "PyTorch comparison"), so main() takes every event time
    before the first kernel span. span() times them by their kernels' span from CUPTI."""

    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush_buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
        self.flush_kernels = self.marker_kernels = None  # (learnt under the profiler, by span())

    def flush(self):
        self.flush_buf.random_()

    @staticmethod
    def mark():  # a kernel of its own name after each timed call: the end of its kernels in the trace
        torch.cuda._sleep(1)

    @staticmethod
    def _kernel_names(fn):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}

    def _flushed(self, prepare):
        prepare()
        self.flush()
        torch.cuda.synchronize()

    @staticmethod
    def warm_up(prepare, call):  # compilation, autotuning, the allocator
        for _ in range(3):
            prepare()
            call()
        torch.cuda.synchronize()

    def event(self, prepare, call, iters):
        """The CUDA-event median, us: launch and the host's time in the call included; the stream is
        fetched before and the call's outputs are freed after the timed span, as a caller that uses them."""
        self.warm_up(prepare, call)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream = torch.cuda.current_stream()
        times = []
        for _ in range(iters):
            self._flushed(prepare)
            start.record(stream)
            out = call()
            stop.record(stream)
            torch.cuda.synchronize()
            times.append(1e3 * start.elapsed_time(stop))
            del out
        return statistics.median(times)

    def span(self, prepare, call, iters):
        """The median kernel span, us: first kernel start to last kernel end, between the flush and a
        marker kernel launched after the call."""
        if self.flush_kernels is None:
            self.flush_kernels, self.marker_kernels = self._kernel_names(self.flush), self._kernel_names(self.mark)
        self.warm_up(prepare, call)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                self._flushed(prepare)
                call()
                self.mark()
                torch.cuda.synchronize()
        kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                         if e.device_type == torch.autograd.DeviceType.CUDA)
        spans, current = [], None  # a call's kernels: after a flush kernel, before the marker
        for s, e, name in kernels:
            if name in self.flush_kernels:
                current = []
            elif name in self.marker_kernels:
                if current:
                    spans.append(max(end for _, end in current) - min(begin for begin, _ in current))
                current = None
            elif current is not None:
                current.append((s, e))
        return statistics.median(spans) if spans else float("nan")


def case_calls(c, compiled):
    """The timed calls of one case, by name: (prepare, call)."""
    n, b, s, s_max = int(c["case"]), int(c["batch_size"]), int(c["new_seq_len"]), int(c["max_seq_len"])
    h, d = int(c["num_kv_heads"]), int(c["head_dim"])
    torch.manual_seed(n)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    gk, gv = torch.randn(b, h, s_max, d, **bf), torch.randn(b, h, s_max, d, **bf)
    k, v = torch.randn(b, h, s, d, **bf), torch.randn(b, h, s, d, **bf)
    ang = torch.rand(b, s, d, device="cuda") * 6
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    pos = torch.arange(s, device="cuda")
    kc, vc = torch.randn(b, h, s_max, d, **bf), torch.randn(b, h, s_max, d, **bf)
    ko = torch.empty_like(k)
    work = {}

    def fresh():  # in-place calls get their own copies, made before the flush
        work["gk"], work["gv"] = gk.clone(), gv.clone()

    def fresh_caches():
        work["kc"], work["vc"] = kc.clone(), vc.clone()

    def nothing():
        pass

    bwd, bwd_, fwd_ = compiled
    return {
        "bwd_eager": (nothing, lambda: eager_backward(gk, gv, k, cos, sin, pos)),
        "bwd_compile": (nothing, lambda: bwd(gk, gv, k, cos, sin, pos)),
        "bwd_kvrope": (nothing, lambda: kvrope_torch.backward(gk, gv, k, cos, sin, pos)),
        "bwd_inplace_compile": (fresh, lambda: bwd_(work["gk"], work["gv"], k, cos, sin, pos)),
        "bwd_inplace_kvrope": (fresh, lambda: kvrope_torch.backward_(work["gk"], work["gv"], k, cos, sin, pos)),
        "fwd_eager": (fresh_caches, lambda: eager_forward_(k, v, work["kc"], work["vc"], cos, sin, pos)),
        "fwd_compile": (fresh_caches, lambda: fwd_(k, v, work["kc"], work["vc"], cos, sin, pos)),
        "fwd_kvrope": (fresh_caches,
                       lambda: kvrope_torch.forward_(k, v, work["kc"], work["vc"], pos, cos, sin, key_out=ko)),
    }


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--cases", default="")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    with open(os.path.join(HERE, "sol_execbench_062_cases.csv")) as f:
        cases = [row for row in csv.DictReader(f)]
    if args.cases:
        keep = {int(c) for c in args.cases.split(",")}
        cases = [c for c in cases if int(c["case"]) in keep]
    clock = Clock()
    dev = torch.cuda.get_device_name(0)
    print(f"torch_compare: {dev}, torch {torch.__version__} (CUDA {torch.version.cuda}), bf16, "
          f"median of {args.iters} calls, L2 flushed before each; times in us (event / CUPTI kernel span)")
    compiled = (torch.compile(eager_backward), torch.compile(eager_backward_), torch.compile(eager_forward_))
    results = [{"case": int(c["case"]), "B": int(c["batch_size"]), "S": int(c["new_seq_len"]),
                "S_max": int(c["max_seq_len"])} for c in cases]
    # An untimed pass first: torch.compile's graphs for every shape (the first case's static graph, the
    # later dynamic one) exist before the timed passes, so both time the graph each case keeps.
    for c in cases:
        for prepare, call in case_calls(c, compiled).values():
            Clock.warm_up(prepare, call)
        del prepare, call
        torch.cuda.empty_cache()
    for clock_pass in (clock.event, clock.span):  # every event time before the spans (Clock's note)
        for c, r in zip(cases, results):
            for name, (prepare, call) in case_calls(c, compiled).items():
                r.setdefault(name, []).append(clock_pass(prepare, call, args.iters))
            del prepare, call
            torch.cuda.empty_cache()
    for r in results:
        print(f"case {r['case']:2d} B {r['B']:3d} S {r['S']:5d} S_max {r['S_max']:5d} | " + "  ".join(
            f"{key} {r[key][0]:.1f}/{r[key][1]:.1f}" for key in r if key.startswith(("bwd", "fwd"))))
    keys = [k for k in results[0] if k.startswith(("bwd", "fwd"))]
    print("\ngeometric means over %d cases (us): CUDA-event clock / CUPTI kernel span" % len(results))
    g = {}
    for key in keys:
        g[key] = (geomean([r[key][0] for r in results]), geomean([r[key][1] for r in results]))
        print(f"{key} geomean us = {g[key][0]:.2f} / {g[key][1]:.2f}")
    print("speedups, CUDA-event clock:")
    print(f"backward out of place: kvrope vs eager {g['bwd_eager'][0] / g['bwd_kvrope'][0]:.2f} x, "
          f"vs torch.compile {g['bwd_compile'][0] / g['bwd_kvrope'][0]:.2f} x")
    print(f"backward in place: kvrope vs torch.compile {g['bwd_inplace_compile'][0] / g['bwd_inplace_kvrope'][0]:.2f} x")
    print(f"forward in place: kvrope vs eager {g['fwd_eager'][0] / g['fwd_kvrope'][0]:.2f} x, "
          f"vs torch.compile {g['fwd_compile'][0] / g['fwd_kvrope'][0]:.2f} x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "iters": args.iters, "cases": results,
                       "geomeans": g}, f, indent=1)


if __name__ == "__main__":
    main()
