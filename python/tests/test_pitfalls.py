"""What users trip over (issue 36): each test failed before its fix. CPU tensors: they run in CI."""
import pytest
import torch

import kvrope_torch
import reference

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


def _glm_inputs(requires_grad=False):
    """k, v, caches and positions, and one angle a pair: Hugging Face's tables for it (cat(freqs, freqs),
    as every model's rotary embedding returns them) and the per-element tables of the interleaved pairs."""
    k, v, kc, vc, pos, _, _ = _inputs(requires_grad)
    g = torch.Generator().manual_seed(361)
    freqs = torch.rand(1, S, D // 2, generator=g) * 6.0
    emb = torch.cat((freqs, freqs), dim=-1)
    hf = (emb.cos().requires_grad_(requires_grad), emb.sin().requires_grad_(requires_grad))
    return k, v, kc, vc, pos, hf


def _glm_reference(k, v, kc, vc, pos, cos_hf, sin_hf):
    # GLM's own conversion (cos[..., :R/2].repeat_interleave(2)), then the interleaved rotation.
    half = cos_hf.shape[-1] // 2
    cos = cos_hf[..., :half].repeat_interleave(2, dim=-1)
    sin = sin_hf[..., :half].repeat_interleave(2, dim=-1)
    return reference.forward(k, v, kc, vc, pos, cos, sin, "interleaved")


def test_interleaved_style_takes_hugging_face_tables():
    # Before: Hugging Face's cos / sin (the rotate-half layout) with style="interleaved" rotated each pair
    # (2i, 2i + 1) by two unrelated angles, silently. table_layout="half" takes them as they are.
    k, v, kc, vc, pos, (cos, sin) = _glm_inputs(requires_grad=True)
    want = _glm_reference(k, v, kc, vc, pos, cos, sin)
    got = kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style="interleaved", table_layout="half")
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w.to(g_.dtype), rtol=1e-5, atol=1e-5)
    wrong = kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style="interleaved")[2]
    assert not torch.allclose(wrong, want[2].to(wrong.dtype), atol=1e-3)  # the default layout: another rotation
    # Gradients reach the given tables through the conversion, as through GLM's.
    weight = torch.randn(B, H, L, D)
    (got[0] * weight).sum().backward()
    grads = (k.grad.clone(), cos.grad.clone(), sin.grad.clone())
    k.grad = cos.grad = sin.grad = None
    (want[0] * weight.double()).sum().backward()
    for g_, w in zip(grads, (k.grad, cos.grad, sin.grad)):
        torch.testing.assert_close(g_, w.to(g_.dtype), rtol=1e-5, atol=1e-5)
    # The in-place forward takes them too.
    with torch.no_grad():
        kc2, vc2 = kc.clone(), vc.clone()
        kvrope_torch.forward_(k, v, kc2, vc2, pos, cos, sin, style="interleaved", table_layout="half")
    torch.testing.assert_close(kc2, got[0].detach())
    with pytest.raises(ValueError, match="table_layout must be"):
        kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, table_layout="hf")


def test_check_rejects_hugging_face_tables_given_as_elements():
    # check=True with the interleaved style: Hugging Face's layout given as elements is refused, naming
    # the way out; tables of one value an element of any other kind are taken.
    k, v, kc, vc, pos, (cos, sin) = _glm_inputs()
    with pytest.raises(ValueError, match="table_layout='half'"):
        kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style="interleaved", check=True)
    kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style="interleaved", table_layout="half", check=True)
    kvrope_torch.forward(k, v, kc, vc, pos, cos, sin, style="rotate_half", check=True)  # HF's own pairs
    per_pair = cos[..., : D // 2].repeat_interleave(2, dim=-1)
    kvrope_torch.forward(k, v, kc, vc, pos, per_pair, per_pair, style="interleaved", check=True)
    kvrope_torch.forward(k, v, kc, vc, pos, torch.randn(1, S, D), torch.randn(1, S, D), style="interleaved",
                         check=True)
