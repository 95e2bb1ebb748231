"""kvrope_torch's ops against the tests' eager reference (reference.py): opcheck (CPU and CUDA) and
gradcheck (CPU), every op on CPU and CUDA, torch.compile against eager. CUDA tests are skipped without a device."""
import os
import random

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import kvrope_torch
from reference import (apply_rotary, forward, forward_sequential, rotary_abs_sum, within_tolerance, wrap)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
STYLES = ["rotate_half", "interleaved"]
LEADERBOARD = [  # (B, S, S_max) of bench/sol_execbench_062_cases.csv, H = 8, D = 128
    (1, 691, 2048), (16, 919, 8192), (4, 773, 4096), (2, 211, 1024), (4, 256, 2048), (8, 256, 2048),
    (2, 541, 2048), (1, 1, 256), (2, 2048, 4096), (32, 1, 2048), (8, 449, 4096), (4, 1, 512),
    (32, 512, 4096), (16, 613, 4096), (32, 2048, 8192), (1, 293, 2048)]


def make(b, h, s, s_max, d, r, dtype, device, shared_tables=False, layout="bhsd", positions="arange", seed=0):
    """Random inputs (never zeros) as a call would pass them; BSHD tensors as [B, H, S, D] views."""
    g = torch.Generator().manual_seed(seed)

    def rows(length):
        if layout == "bhsd":
            return torch.randn(b, h, length, d, generator=g).to(device=device, dtype=dtype)
        return torch.randn(b, length, h, d, generator=g).to(device=device, dtype=dtype).transpose(1, 2)

    k, v, kc, vc = rows(s), rows(s), rows(s_max), rows(s_max)
    angles = torch.rand(1 if shared_tables else b, s, r, generator=g) * 6.0
    cos, sin = angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)
    if positions == "arange":
        pos = torch.arange(s)
    elif positions == "scattered":
        pos = torch.randperm(s_max, generator=g)[:s]
    elif positions == "negative":
        pos = torch.randperm(s_max, generator=g)[:s] - s_max
    else:  # "wrap": one run past the cache's end
        pos = (torch.arange(s) + s_max - s // 2) % s_max
    return k, v, kc, vc, pos.to(device), cos, sin


def check_close(name, out, gold, abs_sum, dtype):
    ok, excess, at = within_tolerance(out.cpu(), gold.cpu(), abs_sum.cpu(), dtype)
    assert ok, f"{name}: beyond tolerance by {excess:.3g} at flat index {at}"


def check_forward(inputs, style, dtype, kc_new, vc_new, k_rot):
    k, v, kc, vc, pos, cos, sin = [x.cpu() for x in inputs]
    d64 = [x.double() for x in (k, v, kc, vc)]
    gk, gv, gko = forward(*d64, pos, cos.double(), sin.double(), style)
    a = rotary_abs_sum(k.double(), cos.double(), sin.double(), style)
    rows = wrap(pos, kc.shape[2])
    a_cache = torch.zeros_like(d64[2]).index_copy(2, rows, a)
    check_close("key_out", k_rot, gko, a, dtype)
    check_close("key_cache", kc_new, gk, a_cache, dtype)
    assert torch.equal(vc_new.cpu(), gv.to(dtype)), "value_cache: not a bit-exact copy"


def check_backward(inputs, style, dtype, outs, table_grads=True, in_place_caches=None):
    """outs: (gk, gv, gcos, gsin[, gkc, gvc]) against autograd through the float64 reference."""
    k, v, kc, vc, pos, cos, sin = [x.cpu() for x in inputs]
    gen = torch.Generator().manual_seed(7)
    gK, gV = torch.randn(kc.shape, generator=gen).to(dtype), torch.randn(vc.shape, generator=gen).to(dtype)
    leaves = [x.double().requires_grad_() for x in (k, v, kc, vc, cos, sin)]
    kc_new, vc_new, _ = forward(leaves[0], leaves[1], leaves[2], leaves[3], pos, leaves[4], leaves[5], style)
    torch.autograd.backward([kc_new, vc_new], [gK.double(), gV.double()])
    gold = [x.grad for x in leaves]
    rows = wrap(pos, kc.shape[2])
    g_rows = gK.double()[:, :, rows]
    a_k = rotary_abs_sum(g_rows, cos.double(), sin.double(), style)  # the same products' magnitudes
    check_close("grad_key_states", outs[0], gold[0], a_k, dtype)
    assert torch.equal(outs[1].cpu(), gold[1].to(dtype)), "grad_value_states: not a bit-exact copy"
    if table_grads:
        r = cos.shape[-1]
        a_t = (g_rows[..., :r].abs() * k.double()[..., :r].abs()).sum(1)
        a_t = a_t.sum(0, keepdim=True) if cos.shape[0] == 1 else a_t
        a_s = (g_rows[..., :r].abs() * k.double()[..., :r].flip(-1).abs()).sum(1)  # a bound of the same size
        a_s = a_s.sum(0, keepdim=True) if cos.shape[0] == 1 else a_s
        check_close("grad_cos", outs[2], gold[4], a_t + a_s, dtype)
        check_close("grad_sin", outs[3], gold[5], a_t + a_s, dtype)
    caches = outs[4:6] if in_place_caches is None else in_place_caches
    assert torch.equal(caches[0].cpu(), gold[2].to(dtype)), "grad of the incoming key cache"
    assert torch.equal(caches[1].cpu(), gold[3].to(dtype)), "grad of the incoming value cache"
    return gK, gV


# --- the op's contract, checked by torch (float64 on the CPU, float32 on CUDA) -------------------

def small(dtype=torch.float64, device="cpu", r=8, **kw):
    return make(2, 3, 5, 9, 8 if r <= 8 else r, r, dtype, device, **kw)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_opcheck(style, layout, device):
    """torch's checks of each op, the fake implementations' shapes and strides among them."""
    st = 0 if style == "rotate_half" else 1
    dtype = torch.float64 if device == "cpu" else torch.float32
    k, v, kc, vc, pos, cos, sin = small(dtype, device, positions="scattered", layout=layout)
    torch.library.opcheck(torch.ops.kvrope.forward.default, (k, v, kc, vc, pos, cos, sin, 0, st))
    torch.library.opcheck(torch.ops.kvrope.forward_.default,
                          (k, v, kc.clone(), vc.clone(), pos, cos, sin, None, None, None, None, torch.empty_like(k),
                           None, 0, st), test_utils=("test_schema", "test_faketensor"))
    gk, gv = torch.randn_like(kc), torch.randn_like(vc)
    torch.library.opcheck(torch.ops.kvrope.backward.default, (gk, gv, k, cos, sin, pos, 0, st, True))
    torch.library.opcheck(torch.ops.kvrope.backward_.default, (gk.clone(), gv.clone(), k, cos, sin, pos, 0, st, True),
                          test_utils=("test_schema", "test_faketensor"))
    # opcheck leaves strides out; a compiled graph reads its outputs with the fake implementation's
    check_fake_strides(torch.ops.kvrope.forward.default, (k, v, kc, vc, pos, cos, sin, 0, st))
    check_fake_strides(torch.ops.kvrope.backward.default, (gk, gv, k, cos, sin, pos, 0, st, True))
    check_fake_strides(torch.ops.kvrope.backward_.default, (gk.clone(), gv.clone(), k, cos, sin, pos, 0, st, True))


def check_fake_strides(op, args):
    with FakeTensorMode() as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    for i, (f, r) in enumerate(zip(fake, op(*args))):
        assert f.shape == r.shape and f.stride() == r.stride(), \
            f"{op}: output {i} has shape {tuple(r.shape)}, strides {r.stride()}; the fake one {tuple(f.shape)}, {f.stride()}"


class Seen:
    """A mode's record of the functions it saw."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def record(self, func, args, kwargs):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class FunctionCalls(Seen, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.record(func, args, kwargs)


class DispatchCalls(Seen, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.record(func, args, kwargs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_api_calls_the_ops(device):
    """The API calls each op from C++ (kvrope_torch._C, through the dispatcher), or through torch.ops where a
    __torch_function__ mode must see it: the same results, and every mode sees the op it would see."""
    k, v, kc, vc, pos, cos, sin = small(torch.float32, device, positions="scattered")
    gk, gv = torch.randn_like(kc), torch.randn_like(vc)
    ops = torch.ops.kvrope
    for got, want in zip(kvrope_torch.backward(gk, gv, k, cos, sin, pos),
                         ops.backward.default(gk, gv, k, cos, sin, pos, 0, 0, True)):
        assert torch.equal(got, want)
    for got, want in zip(kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style="interleaved"),
                         ops.forward.default(k, v, kc, vc, pos, cos, sin, 0, 1)):
        assert torch.equal(got, want)

    function_mode = FunctionCalls()
    with function_mode:
        kvrope_torch.backward_(gk.clone(), gv.clone(), k, cos, sin, pos)
    assert "kvrope.backward_.default" in function_mode.seen
    dispatch_mode = DispatchCalls()
    with dispatch_mode:
        kvrope_torch.forward_(k, v, kc.clone(), vc.clone(), pos, cos, sin)
    assert "kvrope.forward_.default" in dispatch_mode.seen
    with pytest.raises(TypeError, match="kvrope.backward: cos must be a tensor, not list"):
        kvrope_torch._C.backward(gk, gv, k, [1.0], sin, pos, 0, 0, True)
    with pytest.raises(TypeError, match="kvrope.backward_: table_grads must be a bool, not int"):
        kvrope_torch._C.backward_(gk, gv, k, cos, sin, pos, 0, 0, 1)
    with pytest.raises(TypeError, match="kvrope.forward_ takes 15 arguments, not 2"):
        kvrope_torch._C.forward_(k, v)
    with pytest.raises(OverflowError):
        kvrope_torch._C.backward(gk, gv, k, cos, sin, pos, 2**70, 0, True)
    with pytest.raises(TypeError, match="kvrope.backward: rotary_dim must be an int, not bool"):
        kvrope_torch._C.backward(gk, gv, k, cos, sin, pos, True, 0, True)
    for got, want in zip(kvrope_torch.backward(gk, gv, k, cos, sin, pos, table_grads=1),  # any truth value
                         ops.backward.default(gk, gv, k, cos, sin, pos, 0, 0, True)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_in_place_ops_bump_versions(device):
    """forward_ and backward_ bump the version counters of the tensors they write, as torch's in-place ops
    do, so that autograd detects a tensor it saved and one of them changed."""
    k, v, kc, vc, pos, cos, sin = small(torch.float32, device)
    ko, gk, gv = torch.empty_like(k), torch.randn_like(kc), torch.randn_like(vc)
    written = (kc, vc, ko, gk, gv)
    before = [t._version for t in written]
    kvrope_torch.forward_(k, v, kc, vc, pos, cos, sin, key_out=ko)
    kvrope_torch.backward_(gk, gv, k, cos, sin, pos)
    assert all(t._version > b for t, b in zip(written, before)), [t._version for t in written]
    x = torch.randn_like(kc).requires_grad_()
    y = (x * kc).sum()  # saves kc for its backward
    kvrope_torch.forward_(k, v, kc, vc, pos, cos, sin)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("shared", [False, True])
def test_gradcheck(style, shared):
    k, v, kc, vc, pos, cos, sin = small(r=6, shared_tables=shared, positions="scattered")
    args = [x.requires_grad_() for x in (k, v, kc, vc, cos, sin)]

    def f(k, v, kc, vc, cos, sin):
        return kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style=style)

    assert torch.autograd.gradcheck(f, args)


# --- every op against the eager reference ----------------------------------------------------------

def run_all_ops(b, h, s, s_max, d, r, dtype, device, style, **kw):
    inputs = make(b, h, s, s_max, d, r, dtype, device, **kw)
    k, v, kc, vc, pos, cos, sin = inputs
    kc_new, vc_new, k_rot = kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style=style)
    check_forward(inputs, style, dtype, kc_new, vc_new, k_rot)
    kc2, vc2, ko = kc.clone(), vc.clone(), torch.full_like(k, float("nan"))
    kvrope_torch.forward_(k, v, kc2, vc2, pos, cos, sin, key_out=ko, style=style)
    check_forward(inputs, style, dtype, kc2, vc2, ko)
    gK, gV = check_backward(inputs, style, dtype, kvrope_torch.backward(
        *[t.to(device) for t in make_grads(kc, vc, dtype)], k, cos, sin, pos, style=style))
    gKi, gVi = gK.to(device), gV.to(device)
    outs = kvrope_torch.backward_(gKi, gVi, k, cos, sin, pos, style=style)
    check_backward(inputs, style, dtype, outs, in_place_caches=(gKi, gVi))


def make_grads(kc, vc, dtype):
    gen = torch.Generator().manual_seed(7)
    return torch.randn(kc.shape, generator=gen).to(dtype), torch.randn(vc.shape, generator=gen).to(dtype)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("r", [16, 8])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_cpu_ops(style, r, layout):
    run_all_ops(2, 3, 7, 12, 16, r, torch.float32, "cpu", style, layout=layout, positions="negative")


def test_cpu_repeats_and_table_cache():
    """Repeated rows (the last token wins), an out-of-range position (no row, the flag), a table cache."""
    k, v, kc, vc, pos, cos, sin = small(dtype=torch.float32)
    pos = torch.tensor([3, 1, 3, 20, 1])
    flag = torch.zeros(1, dtype=torch.int32)
    kc2, vc2, ko = kc.clone(), vc.clone(), torch.empty_like(k)
    kvrope_torch.forward_(k, v, kc2, vc2, pos, cos, sin, key_out=ko, error_flag=flag)
    gk, gv, gko = forward_sequential(k.double(), v.double(), kc.double(), vc.double(), pos, cos.double(),
                                     sin.double(), "rotate_half")
    torch.testing.assert_close(kc2.double(), gk, rtol=1e-6, atol=1e-6)
    assert torch.equal(vc2, gv.float())
    assert int(flag) == kvrope_torch.ERROR_POSITION_OUT_OF_RANGE
    # the table cache: one angle a pair, cos | sin, indexed by position ids
    angles = torch.rand(16, 4) * 6
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    ids = torch.tensor([0, 5, 9, 2, 15])
    q = torch.randn(2, 4, 5, 8)
    q_ref = apply_rotary(q.double(), cache[ids, :4].repeat(1, 2)[None].double(),
                         cache[ids, 4:].repeat(1, 2)[None].double(), "rotate_half")
    kc3, vc3 = kc.clone(), vc.clone()
    kvrope_torch.forward_(k, v, kc3, vc3, torch.arange(5), cos_sin_cache=cache, position_ids=ids, query=q)
    torch.testing.assert_close(q.double(), q_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_errors_are_clear(device):
    """Every op checks its arguments, the CPU and CUDA ops with one copy of the checks (csrc/checks.cpp)."""
    k, v, kc, vc, pos, cos, sin = small(dtype=torch.float32, device=device)
    with pytest.raises(TypeError, match="int32 or int64"):
        kvrope_torch.forward(k, v, kc, vc, pos.float(), cos, sin)
    with pytest.raises(ValueError, match="key_cache has shape"):
        kvrope_torch.forward(k, v, kc[:, :2], vc, pos, cos, sin)
    with pytest.raises(TypeError, match="one dtype"):
        kvrope_torch.forward(k, v.half(), kc, vc, pos, cos, sin)
    with pytest.raises(ValueError, match="style"):
        kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style="neox")
    with pytest.raises(ValueError, match="contiguous"):
        kvrope_torch.forward(k, v, kc, vc, pos, cos, sin[..., ::2].repeat_interleave(2, -1).transpose(1, 2)
                             .contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="rotary dim"):
        kvrope_torch.forward(k, v, kc, vc, pos, cos[..., :3], sin[..., :3])
    with pytest.raises(ValueError, match="give either cos and sin or cos_sin_cache"):
        kvrope_torch.forward_(k, v, kc, vc, pos, cos, sin, cos_sin_cache=cos[0], position_ids=pos)
    with pytest.raises(ValueError, match="query_out needs query"):
        kvrope_torch.forward_(k, v, kc, vc, pos, cos, sin, query_out=k.clone())
    gk, gv = torch.randn_like(kc), torch.randn_like(vc)
    with pytest.raises(ValueError, match="table gradients need key_states"):
        kvrope_torch.backward(gk, gv, None, cos, sin, pos)
    with pytest.raises(TypeError, match="grad_value_cache is .*, grad_key_cache .*: every float tensor has one dtype"):
        kvrope_torch.backward(gk, gv.half(), k, cos, sin, pos)  # named against the backward's first tensor
    with pytest.raises(ValueError, match=r"grad_value_cache has shape \[2, 3, 8, 8\], expected \[2, 3, 9, 8\]"):
        kvrope_torch.backward_(gk, gv[:, :, :8], k, cos, sin, pos)
    with pytest.raises(ValueError, match="last dim must be contiguous"):  # an expanded gradient, stride 0
        kvrope_torch.backward_(gk, torch.ones(1, device=device).expand_as(gv), k, cos, sin, pos)
    with pytest.raises(ValueError, match="rotary_dim 4 differs"):
        torch.ops.kvrope.backward(gk, gv, k, cos, sin, pos, 4, 0, True)
    # a cache_position of the wrong length is named, in the backward as in the forward
    with pytest.raises(ValueError, match=r"cache_position has shape \[2\], expected \[5\]"):
        kvrope_torch.backward(gk, gv, k, cos, sin, pos[:2])
    with pytest.raises(ValueError, match=r"cache_position has shape \[2\], expected \[5\]"):
        kvrope_torch.forward(k, v, kc, vc, pos[:2], cos, sin)
    with pytest.raises(ValueError, match="style must be 0"):
        torch.ops.kvrope.backward(gk, gv, k, cos, sin, pos, 0, 7, True)
    # the first tensor's last dim (the one the others are compared with), strided and expanded
    strided = torch.randn(*k.shape[:3], 2 * k.shape[3], device=device)[..., ::2]
    with pytest.raises(ValueError, match="key_states's last dim must be contiguous"):
        kvrope_torch.forward(strided, v, kc, vc, pos, cos, sin)
    with pytest.raises(ValueError, match="key_states's last dim must be contiguous"):
        kvrope_torch.forward_(strided, v, kc, vc, pos, cos, sin)
    with pytest.raises(ValueError, match="grad_key_cache's last dim must be contiguous"):
        kvrope_torch.backward_(torch.ones(1, device=device).expand_as(gk), gv, k, cos, sin, pos)


def test_compiled_errors_are_clear():
    """The fake implementations check too: a compiled function's bad call fails with the op's message."""
    k, v, kc, vc, pos, cos, sin = small(dtype=torch.float32)
    gk, gv = torch.randn_like(kc), torch.randn_like(vc)
    with pytest.raises(Exception, match=r"grad_key_cache must be \[B, H, S_max, D\]"):
        torch.compile(kvrope_torch.backward, fullgraph=True)(gk[0], gv, k, cos, sin, pos)


def test_compile_matches_eager():
    k, v, kc, vc, pos, cos, sin = small(dtype=torch.float32, positions="scattered")

    def step(k, v, kc, vc, cos, sin):
        kc_new, vc_new, k_rot = kvrope_torch.forward(k, v, kc, vc, pos, cos, sin)
        return (kc_new * 2).sum() + vc_new.sum() + k_rot.square().sum()

    args = [x.clone().requires_grad_() for x in (k, v, kc, vc, cos, sin)]
    eager = step(*args)
    eager_grads = torch.autograd.grad(eager, args)
    args2 = [x.detach().clone().requires_grad_() for x in args]
    compiled = torch.compile(step, fullgraph=True)(*args2)
    compiled_grads = torch.autograd.grad(compiled, args2)
    torch.testing.assert_close(compiled, eager)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b)


# --- CUDA ------------------------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("case", range(len(LEADERBOARD)))
def test_cuda_leaderboard_shapes(case):
    b, s, s_max = LEADERBOARD[case]
    run_all_ops(b, 8, s, s_max, 128, 128, torch.bfloat16, "cuda", "rotate_half", seed=case)


@needs_cuda
@pytest.mark.parametrize("seed", range(int(os.environ.get("KVROPE_TORCH_RANDOM", "24"))))
def test_cuda_random_configurations(seed):
    rng = random.Random(seed)
    d = rng.choice([64, 80, 96, 128, 256, 2 * rng.randint(1, 100)])
    r = rng.choice([d, d // 2 - (d // 2) % 2 or 2, 2 * rng.randint(1, d // 2)])
    dtype = rng.choice([torch.bfloat16, torch.float16, torch.float32])
    s = rng.choice([1, rng.randint(1, 300)])
    run_all_ops(rng.randint(1, 4), rng.randint(1, 8), s, s + rng.randint(0, 64), d, r, dtype, "cuda",
                rng.choice(STYLES), layout=rng.choice(["bhsd", "bshd"]), shared_tables=rng.random() < 0.3,
                positions=rng.choice(["arange", "scattered", "negative", "wrap"]), seed=seed)


@needs_cuda
def test_cuda_compile_and_graph():
    k, v, kc, vc, pos, cos, sin = make(2, 4, 9, 32, 64, 64, torch.bfloat16, "cuda")
    eager = kvrope_torch.forward(k, v, kc, vc, pos, cos, sin)
    compiled = torch.compile(lambda *a: kvrope_torch.forward(*a), fullgraph=True)(k, v, kc, vc, pos, cos, sin)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
    kc2, vc2 = kc.clone(), vc.clone()
    graph = torch.cuda.CUDAGraph()
    kvrope_torch.forward_(k, v, kc2, vc2, pos, cos, sin)  # warm-up outside the capture
    with torch.cuda.graph(graph):
        kvrope_torch.forward_(k, v, kc2, vc2, pos, cos, sin)
    kc2.copy_(kc)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(kc2, eager[0])


def test_example_trains_like_plain_pytorch(monkeypatch):
    """python/examples/static_cache_attention.py: its layer through kvrope matches plain PyTorch."""
    import runpy
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "static_cache_attention.py")
    monkeypatch.setattr("sys.argv", [path, "--device", "cuda" if CUDA else "cpu", "--steps", "2"])
    runpy.run_path(path, run_name="__main__")
