#!/usr/bin/env python3
"""Where a kvrope torch op's host time goes: the wall time (time.perf_counter_ns) of the Python call to
return, median of --iters calls with the device synchronized before each, for the API call and its parts:
the Python checks, the op's overload called directly, the outputs' allocations alone, and one small torch
kernel launch for scale. The backward on one leaderboard shape (default case 8: B 1, S 1, S_max 256).
docs/benchmarks.md ("PyTorch comparison") measured 55-70 us of host time a call on the H200 machine;
this splits it. Runs on CPU tensors too (--device cpu), where the op computes on the host.

    python3 dev/scripts/torch_host_time.py [--device cuda] [--iters 200] [--case 8]
"""
import argparse
import csv
import os
import statistics
import time

import torch

import kvrope_torch
from kvrope_torch import _checks

HERE = os.path.dirname(os.path.abspath(__file__))


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
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    bf = dict(device=dev, dtype=torch.bfloat16)
    gk, gv = torch.randn(b, h, s_max, d, **bf), torch.randn(b, h, s_max, d, **bf)
    k = torch.randn(b, h, s, d, **bf)
    cos, sin = torch.randn(b, s, d, **bf), torch.randn(b, s, d, **bf)
    pos = torch.arange(s, device=dev)
    op = torch.ops.kvrope.backward.default

    def outputs():  # what the op allocates: grad k, grad v, grad cos, grad sin, the two cache gradients
        return (torch.empty(b, h, s, d, **bf), torch.empty(b, h, s, d, **bf), torch.empty_like(cos),
                torch.empty_like(sin), torch.empty_like(gk), torch.empty_like(gv))

    parts = [
        ("API call kvrope_torch.backward", lambda: kvrope_torch.backward(gk, gv, k, cos, sin, pos)),
        ("  its Python checks", lambda: _checks.check_backward(gk, gv, k, cos, sin, pos, True)),
        ("  the op's overload, directly", lambda: op(gk, gv, k, cos, sin, pos, 0, 0, True)),
        ("  six output allocations", outputs),
        ("one small torch kernel (fill_)", lambda: k.fill_(1.0)),
    ]
    print(f"torch_host_time: {torch.cuda.get_device_name(0) if dev.type == 'cuda' else 'cpu'}, torch "
          f"{torch.__version__}, case {args.case} (B {b}, S {s}, S_max {s_max}), host us, median of {args.iters}")
    for name, fn in parts:
        print(f"{name:34s} {host_us(fn, args.iters, sync):8.2f}")


if __name__ == "__main__":
    main()
