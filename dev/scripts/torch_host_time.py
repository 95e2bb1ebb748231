#!/usr/bin/env python3
"""Where a kvrope torch op's host time goes. Part 1: the wall time (time.perf_counter_ns) of a Python
call to return, median of --iters calls with the device synchronized before each: the three API calls
(backward, backward_, forward_ with key_out), the backward's overload called directly (torch.ops'
argument parsing, the dispatcher, the C++ checks, six allocations, the launch), its C++ entry
(kvrope_torch._C, as the API calls it: the same without torch.ops' parsing), the overload under
inference mode (no autograd keys), six output allocations from Python, one small torch kernel (fill_)
and a CUDA event's record() for scale. Part 2: the CUDA-event clock of bench/torch_compare.py
(synchronize, record, call, record) on one call, against a fill_, median of --iters, without and with
an L2 flush (a write of twice the L2) before each call. Part 3: a torch.profiler table of --iters API backward calls
(self CPU time per op and CUDA runtime call). Parts 4 and 5: parts 2 and 1 again, after the profiler
has run in the process. The backward on one leaderboard shape (default case 8:
B 1, S 1, S_max 256). Runs on CPU tensors too (--device cpu; parts 1 only), where the ops compute on
the host.

    python3 dev/scripts/torch_host_time.py [--device cuda] [--iters 200] [--case 8]
"""
import argparse
import csv
import os
import statistics
import sys
import time

import torch

import kvrope_torch
from kvrope_torch import _checks

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from torch_compare import Clock  # noqa: E402  (the event clock of torch_compare itself)


def host_us(fn, iters, sync):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    sync()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--case", type=int, default=8)
    args = parser.parse_args()
    with open(os.path.join(HERE, "..", "..", "bench", "sol_execbench_062_cases.csv")) as f:
        row = next(r for r in csv.DictReader(f) if int(r["case"]) == args.case)
    b, s, s_max = int(row["batch_size"]), int(row["new_seq_len"]), int(row["max_seq_len"])
    h, d = int(row["num_kv_heads"]), int(row["head_dim"])
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    bf = dict(device=dev, dtype=torch.bfloat16)
    gk, gv = torch.randn(b, h, s_max, d, **bf), torch.randn(b, h, s_max, d, **bf)
    k, v, ko = torch.randn(b, h, s, d, **bf), torch.randn(b, h, s, d, **bf), torch.empty(b, h, s, d, **bf)
    kc, vc = torch.randn(b, h, s_max, d, **bf), torch.randn(b, h, s_max, d, **bf)
    cos, sin = torch.randn(b, s, d, **bf), torch.randn(b, s, d, **bf)
    pos = torch.arange(s, device=dev)
    op = torch.ops.kvrope.backward.default
    gk_, gv_ = gk.clone(), gv.clone()  # the in-place call's own (its result is not checked here)

    def outputs():  # the op's outputs, allocated from Python
        return (torch.empty(b, h, s, d, **bf), torch.empty(b, h, s, d, **bf), torch.empty_like(cos),
                torch.empty_like(sin), torch.empty_like(gk), torch.empty_like(gv))

    api_backward = lambda: kvrope_torch.backward(gk, gv, k, cos, sin, pos)  # noqa: E731
    api_backward_ = lambda: kvrope_torch.backward_(gk_, gv_, k, cos, sin, pos)  # noqa: E731
    fill = lambda: k.fill_(1.0)  # noqa: E731
    parts = [
        ("API kvrope_torch.backward", api_backward),
        ("API kvrope_torch.backward_", api_backward_),
        ("API kvrope_torch.forward_ (key_out)", lambda: kvrope_torch.forward_(k, v, kc, vc, pos, cos, sin, key_out=ko)),
        ("the Python checks of the CPU ops",
         lambda: _checks.check_backward(gk, gv, k, cos, sin, pos, 0, 0, True)),
        ("backward's overload, directly", lambda: op(gk, gv, k, cos, sin, pos, 0, 0, True)),
        ("backward's C++ entry (_C), directly", lambda: kvrope_torch._C.backward(gk, gv, k, cos, sin, pos, 0, 0, True)),
        ("six allocations from Python", outputs),
        ("one small torch kernel (fill_)", fill),
    ]
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        parts.append(("a CUDA event's record()", event.record))
    print(f"torch_host_time: {torch.cuda.get_device_name(0) if cuda else 'cpu'}, torch {torch.__version__}, "
          f"case {args.case} (B {b}, S {s}, S_max {s_max}), median of {args.iters}")
    print("part 1: host us until the call returns; two rounds, the second in reverse order")
    rounds = [{name: host_us(fn, args.iters, sync) for name, fn in parts}]
    rounds.append({name: host_us(fn, args.iters, sync) for name, fn in reversed(parts)})
    for name, _ in parts:
        print(f"  {name:40s} {rounds[0][name]:8.2f} {rounds[1][name]:8.2f}")
    with torch.inference_mode():
        print(f"  {'the overload in inference mode':40s} "
              f"{host_us(lambda: op(gk, gv, k, cos, sin, pos, 0, 0, True), args.iters, sync):8.2f}")
    if not cuda:
        return
    flushed, unflushed = Clock(), Clock()
    unflushed.flush = lambda: None
    event_parts = [("API kvrope_torch.backward", api_backward), ("API kvrope_torch.backward_", api_backward_),
                   ("fill_", fill), ("nothing", lambda: None)]

    def part2(title):
        print(f"{title}: CUDA-event clock as bench/torch_compare.py, us: L2 not flushed / flushed before each")
        for name, fn in event_parts:
            times = [clock.event(lambda: None, fn, args.iters) for clock in (unflushed, flushed)]
            print(f"  {name:40s} {times[0]:8.2f} {times[1]:8.2f}")

    part2("part 2")
    print("part 3: torch.profiler, API backward calls")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            api_backward()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    part2("part 4, part 2 again after the profiler")
    print("part 5, part 1 again after the profiler")
    for name, fn in parts:
        print(f"  {name:40s} {host_us(fn, args.iters, sync):8.2f}")


if __name__ == "__main__":
    main()
