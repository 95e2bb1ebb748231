"""What users trip over (issue 36): each test failed before its fix. CPU tensors: they run in CI."""
import pytest
import torch

import kvrope_torch

B, H, S, L, D = 2, 2, 4, 16, 8


def _inputs(requires_grad=False):
    g = torch.Generator().manual_seed(36)
    k = torch.randn(B, H, S, D, generator=g, requires_grad=requires_grad)
    v = torch.randn(B, H, S, D, generator=g, requires_grad=requires_grad)
    kc = torch.randn(B, H, L, D, generator=g)
    vc = torch.randn(B, H, L, D, generator=g)
    cos = torch.randn(1, S, D, generator=g)
    sin = torch.randn(1, S, D, generator=g)
    pos = torch.arange(S, dtype=torch.int64) + 3
    return k, v, kc, vc, pos, cos, sin


def test_forward_in_place_refuses_inputs_that_require_grad():
    # Before: the call returned, the cache left out of the graph (requires_grad False), no warning.
    k, v, kc, vc, pos, cos, sin = _inputs(requires_grad=True)
    with pytest.raises(RuntimeError, match="key_states requires grad"):
        kvrope_torch.forward_(k, v, kc, vc, pos, cos, sin)
    with torch.no_grad():  # inference: allowed, and it writes
        kvrope_torch.forward_(k, v, kc, vc, pos, cos, sin)
    expected = kvrope_torch.forward(k.detach(), v.detach(), kc, vc, pos, cos, sin)[0]
    assert torch.equal(kc[:, :, 3:3 + S], expected[:, :, 3:3 + S])
    # The functional forward joins autograd: the gradient reaches k.
    new_kc, new_vc, _ = kvrope_torch.forward(k, v, kc, vc, pos, cos, sin)
    (new_kc.sum() + new_vc.sum()).backward()
    assert k.grad is not None and v.grad is not None


def test_backward_in_place_refuses_gradients_that_require_grad():
    k, _, kc, vc, pos, cos, sin = _inputs()
    gk, gv = kc.clone().requires_grad_(), vc.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="grad_key_cache requires grad"):
        kvrope_torch.backward_(gk, gv, k, cos, sin, pos)


def test_serving_forward_refuses_inputs_that_require_grad():
    T, Hq, P = 3, 2, 4
    q = torch.randn(T, Hq, D, requires_grad=True)
    k, v = torch.randn(T, H, D), torch.randn(T, H, D)
    table = torch.randn(16, D)
    kc, vc = torch.zeros(4, P, H, D), torch.zeros(4, P, H, D)
    with pytest.raises(RuntimeError, match="query requires grad"):
        kvrope_torch.rope_append_(q, k, v, torch.arange(T), table, kc, vc, torch.arange(T))


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_functional_ops_can_raise_on_dropped_positions(op):
    # Before: a position outside [-S_max, S_max) was dropped (forward) or got zero gradients (backward)
    # with no way to know: the functional ops have no error flag. check=True raises instead.
    k, v, kc, vc, pos, cos, sin = _inputs()
    pos[2] = L + 5
    call = (lambda **kw: kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, **kw)) if op == "forward" else (
        lambda **kw: kvrope_torch.backward(kc, vc, k, cos, sin, pos, **kw))
    call()  # the default stays silent (documented) and never synchronizes
    with pytest.raises(ValueError, match=r"cache_position\[2\] = 21 is outside"):
        call(check=True)
    pos[2] = -L  # wraps to row 0: in range
    call(check=True)


def test_a_bad_dtype_names_its_argument():
    # Before: "kvrope: cpu tensors must be bfloat16, float16, float32 or float64, not torch.int32",
    # naming no argument.
    k, v, kc, vc, pos, cos, sin = _inputs()
    with pytest.raises(TypeError, match="key_states is torch.int32: cpu tensors must be bfloat16"):
        kvrope_torch.forward(k.int(), v, kc, vc, pos, cos, sin)
    with pytest.raises(TypeError, match="grad_key_cache is torch.int32"):
        kvrope_torch.backward(kc.int(), vc, k, cos, sin, pos)
    with pytest.raises(TypeError, match="value_states is torch.float16, key_states torch.float32"):
        kvrope_torch.forward(k, v.half(), kc, vc, pos, cos, sin)
