"""kvrope::rope_append_ (the serving forward, docs/spec.md section 6) and the vLLM-style
rotary_embedding_and_cache against a float64 reference written here from the definition: per-head
RMSNorm, RoPE of pairs (i, i + R/2) or (2i, 2i + 1) from a table cache (with mRoPE, each pair's angle
from the row of its stream's position), the paged scatter (last writer wins), fp8 quantization as
fp8_satfinite(float(x_T) / scale), NVFP4 blocks (reference.nvfp4; and against FlashInfer's own NVFP4
append where it is installed). CPU tests run everywhere; CUDA tests are skipped without a device."""
import functools
import os
import random
from dataclasses import dataclass, field, replace
from typing import Optional

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kvrope_torch
import reference

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52,
                 torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126, torch.float64: -1022,
                torch.float8_e4m3fn: -6, torch.float8_e5m2: -14}


# --- the reference ---------------------------------------------------------------------------------

def ref_norm(x, weight, eps, plus_one):
    w = weight.double() + (1.0 if plus_one else 0.0)
    return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * w


def ref_rope(x, cos_sin_cache, positions, style, r):
    """x [T, H, D] float64; the pairs of spec section 2.4 with one angle a pair from the table cache
    (cos in columns [0, R/2), sin in [R/2, R)). Returns RoPE(x) and the tolerance's A (the sum of the
    products' magnitudes)."""
    half = r // 2
    table = cos_sin_cache.double()[positions.long().clamp(0, cos_sin_cache.shape[0] - 1)]
    c, s = table[:, None, :half], table[:, None, half:r]
    first, second = (slice(0, half), slice(half, r)) if style == "rotate_half" else (slice(0, r, 2), slice(1, r, 2))
    a, b = x[..., first], x[..., second]
    out, mag = x.clone(), x.abs()
    out[..., first], out[..., second] = a * c - b * s, b * c + a * s
    mag[..., first] = a.abs() * c.abs() + b.abs() * s.abs()
    mag[..., second] = b.abs() * c.abs() + a.abs() * s.abs()
    return out, mag


def mrope_rows(cos_sin_cache, positions, r, sections, interleaved):
    """mRoPE: each token's table row [T, R] (cos | sin) from positions [3, T], written pair by pair: pair i
    from the row of stream 1 where i % 3 == 1 and i < 3 s1, of stream 2 where i % 3 == 2 and i < 3 s2
    (interleaved), or of the stream whose section holds it (contiguous: s0 pairs, then s1, then s2)."""
    s0, s1, s2 = sections
    table = cos_sin_cache.double()
    rows = [table[p.long().clamp(0, table.shape[0] - 1)] for p in positions]
    out = rows[0].clone()
    half = r // 2
    for i in range(half):
        if interleaved:
            j = 1 if i % 3 == 1 and i < 3 * s1 else 2 if i % 3 == 2 and i < 3 * s2 else 0
        else:
            j = 0 if i < s0 else 1 if i < s0 + s1 else 2
        out[:, i], out[:, half + i] = rows[j][:, i], rows[j][:, half + i]
    return out


def ulp(x, dtype):
    exponent = torch.floor(torch.log2(x.abs().clamp_min(1e-300))).clamp_min(MIN_EXPONENT[dtype])
    return torch.pow(2.0, exponent - MANTISSA_BITS[dtype])


def bits(x):
    """A tensor's elements as integers of their size: equal where the values are equal bit for bit."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def raw(x):
    """A tensor as compared bit for bit: 1-byte (fp8, uint8) ones as bytes (float8 has few kernels)."""
    return x.view(torch.uint8) if x.element_size() == 1 else x


def to_fp8(x, fmt):
    """fp8_satfinite: torch rounds to nearest even but overflows to NaN / inf (test_torch_fp8_rounding)."""
    big = torch.finfo(fmt).max
    return x.clamp(-big, big).to(fmt)


def assert_close(name, out, gold, mag, dtype, extra=0.0):
    """|out - gold| <= ulp_dtype(gold) + 2^-19 A (+ extra): one rounding to dtype after fp32 math."""
    out, gold = out.double().cpu(), gold.double().cpu()
    excess = (out - gold).abs() - (ulp(gold, dtype) + 2.0 ** -19 * mag + extra)
    if excess.numel() and not bool((excess <= 0).all()):
        i = int(torch.argmax(excess))
        raise AssertionError(f"{name}: beyond tolerance by {excess.flatten()[i].item():.3g} at flat index {i}: "
                             f"{out.flatten()[i].item()} vs {gold.flatten()[i].item()}")


# --- a call's inputs ----------------------------------------------------------------------------------

@dataclass
class Config:
    tokens: int = 13
    q_heads: int = 4
    heads: int = 2
    head_dim: int = 16
    rotary_dim: int = 0            # 0: D
    dtype: torch.dtype = torch.float32
    style: str = "rotate_half"
    layout: str = "NHD"            # NHD, HND, flat, kv (one [pages, 2, P, H, D] tensor)
    page_size: int = 4
    pages: int = 8
    cache: str = "auto"            # auto, fp8_e4m3, fp8_e5m2 (float8 tensors), fp8, fp8_e5m2 as uint8; nvfp4
    uint8: bool = False
    scale: Optional[str] = None    # None, "tensor", "head"
    norm: Optional[str] = None     # None, "qk", "k", "plus_one"
    fused: bool = False            # q, k, v views of one qkv [T, (Hq + 2H) D]
    query: Optional[str] = "in_place"  # in_place, out, fp8_out (a float8_e4m3fn query_out), None
    q_scale: Optional[float] = None  # fp8_out: q_scale's value (None: no q_scale)
    key: Optional[str] = None      # None (k read only), in_place, out
    positions: str = "valid"       # valid, out_of_range
    pos_dtype: torch.dtype = torch.int64
    table_fp32: bool = False
    slots: str = "distinct"        # distinct, padded, repeated, out_of_range
    max_position: int = 40
    seed: int = 0
    extra: dict = field(default_factory=dict)  # kv_cache_dtype: the argument, where not the default
    mrope: Optional[tuple] = None  # mRoPE: the sections' proportions (scaled to R/2: mrope_sections)
    mrope_interleaved: bool = False
    stream_pad: int = 0            # mRoPE: positions [3, T] a view of [3, T + stream_pad]


def mrope_sections(cfg: Config):
    """The call's mrope_section: cfg.mrope's proportions scaled to the R/2 pairs (s0 takes the rest)."""
    pairs, total = (cfg.rotary_dim or cfg.head_dim) // 2, sum(cfg.mrope)
    s1, s2 = cfg.mrope[1] * pairs // total, cfg.mrope[2] * pairs // total
    return [pairs - s1 - s2, s1, s2]


def make_inputs(cfg: Config, device):
    g = torch.Generator().manual_seed(cfg.seed)
    n, hq, h, d, dt = cfg.tokens, cfg.q_heads if cfg.query else 0, cfg.heads, cfg.head_dim, cfg.dtype
    r = cfg.rotary_dim or d
    if cfg.fused:
        qkv = torch.randn(n, (hq + 2 * h) * d, generator=g).to(device=device, dtype=dt)
        q = qkv[:, :hq * d].view(n, hq, d)
        k = qkv[:, hq * d:(hq + h) * d].view(n, h, d)
        v = qkv[:, (hq + h) * d:].view(n, h, d)
    else:
        q, k, v = (torch.randn(n, x, d, generator=g).to(device=device, dtype=dt) for x in (hq, h, h))
    if cfg.cache != "auto" and n:  # values beyond the fp8 range: saturated
        big = 6e4 if cfg.cache == "fp8_e5m2" else 1e3
        v[0, 0, :2] = torch.tensor([big, -big], dtype=dt, device=device)
    if cfg.query == "fp8_out" and n and hq:  # q beyond e4m3's range (unless normed): saturated in query_out
        q[0, -1, :2] = torch.tensor([1e3, -1e3], dtype=dt, device=device)
        q[-1, 0, -2:] = torch.tensor([-2e3, 5e2], dtype=dt, device=device)
    inv = 1.0 / (10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    angles = torch.arange(cfg.max_position, dtype=torch.float64)[:, None] * inv[None]
    table = torch.cat((angles.cos(), angles.sin()), dim=-1)
    cos_sin_cache = table.to(device=device, dtype=torch.float32 if cfg.table_fp32 else dt)
    positions = torch.randint(0, cfg.max_position, (n,), generator=g)
    if cfg.positions == "out_of_range":
        positions[1], positions[4] = cfg.max_position, -1
    if cfg.mrope:  # three streams; a third of the tokens text (the three equal); bad positions in streams 1, 2
        streams = torch.randint(0, cfg.max_position, (3, n + cfg.stream_pad), generator=g)[:, :n]
        streams[:, ::3] = streams[0, ::3]
        if cfg.positions == "out_of_range":
            streams[1, 1], streams[2, 4] = cfg.max_position, -1
        wide = torch.empty(3, n + cfg.stream_pad, dtype=cfg.pos_dtype, device=device)  # the stride kept on CUDA
        wide[:, :n] = streams
        positions = wide[:, :n]
    num_slots = cfg.pages * cfg.page_size if cfg.layout != "flat" else cfg.pages
    slots = torch.randperm(num_slots, generator=g)[:n]
    if cfg.slots == "padded":
        slots[::3] = -1
    elif cfg.slots == "repeated":
        slots[5], slots[9], slots[11] = slots[2], slots[2], slots[7]
    elif cfg.slots == "out_of_range":
        slots[3], slots[-1] = num_slots, num_slots + 100
    if cfg.positions == "out_of_range":
        slots[4] = slots[1]  # a token that writes nothing is not the slot's last writer
    nvfp4 = cfg.cache == "nvfp4"
    cache_dtype = dt if cfg.cache == "auto" else (torch.uint8 if cfg.uint8 or nvfp4 else FP8[cfg.cache])

    def cache_tensor(dtype=cache_dtype, row=d // 2 if nvfp4 else d):
        p, pg = cfg.page_size, cfg.pages
        shape = {"NHD": (pg, p, h, row), "HND": (pg, h, p, row), "flat": (pg, h, row),
                 "kv": (pg, 2, p, h, row)}[cfg.layout]
        if dtype in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2):
            x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
            x = torch.where((x & 0x7F) >= 0x7C, 0, x).view(dtype)  # no NaN / inf bytes
        else:
            x = torch.randn(shape, generator=g).to(dt)
        return x.to(device)

    def pair(**kw):
        if cfg.layout == "kv":
            kv = cache_tensor(**kw)
            return kv[:, 0], kv[:, 1]
        return cache_tensor(**kw), cache_tensor(**kw)

    key_cache, value_cache = pair()
    block_scales = {}
    if nvfp4:  # the block scales: float8_e4m3fn [.., D / 16] in the caches' layout
        block_scales = dict(zip(("key_cache_sf", "value_cache_sf"), pair(dtype=torch.float8_e4m3fn, row=d // 16)))
    scales = {}
    if cfg.scale == "tensor":
        scales = dict(k_scale=torch.tensor(0.5), v_scale=torch.tensor(2.0))
    elif cfg.scale == "head":
        scales = dict(k_scale=torch.rand(h, generator=g) + 0.3, v_scale=torch.rand(h, generator=g) + 0.3)
    if cfg.q_scale is not None:
        scales["q_scale"] = torch.tensor(cfg.q_scale)
    scales = {name: s.to(device) for name, s in scales.items()}
    norms = {}
    if cfg.norm:
        w = lambda: (torch.rand(d, generator=g) + 0.5).to(device=device, dtype=dt)  # noqa: E731
        norms = dict(key_norm_weight=w())
        if cfg.norm != "k" and hq:
            norms["query_norm_weight"] = w()
        norms["norm_weight_plus_one"] = cfg.norm == "plus_one"
        norms["norm_eps"] = 1e-5
    return dict(query=q if hq else None, key=k, value=v, positions=positions.to(device=device, dtype=cfg.pos_dtype),
                cos_sin_cache=cos_sin_cache, key_cache=key_cache, value_cache=value_cache,
                slot_mapping=slots.to(device), **scales, **norms, **block_scales)


def slot_rows(cache, cfg):
    """A cache as [num_slots, H, D] on the CPU, whatever its layout (the kernel's slot addressing)."""
    c = cache.cpu()
    if cfg.layout == "HND":
        c = c.transpose(1, 2)
    return c.reshape(-1, *c.shape[-2:])


def kvrope_kwargs(cfg: Config, inputs, query_out=None, key_out=None, error_flag=None):
    """The API's keyword arguments of a call of `cfg` (the caches as they are: HND with layout='HND')."""
    kw = {name: inputs[name] for name in ("k_scale", "v_scale", "q_scale", "query_norm_weight", "key_norm_weight",
                                          "norm_eps", "norm_weight_plus_one", "key_cache_sf", "value_cache_sf")
          if name in inputs}
    kind = "auto" if cfg.cache == "auto" else ("fp8" if cfg.cache == "fp8_e4m3" and cfg.uint8 else cfg.cache)
    kind = cfg.extra.get("kv_cache_dtype", kind)
    if cfg.mrope:
        kw.update(mrope_section=mrope_sections(cfg), mrope_interleaved=cfg.mrope_interleaved)
    return dict(kw, query_out=query_out, key_out=key_out, key_in_place=cfg.key == "in_place",
                kv_cache_dtype=kind, layout="HND" if cfg.layout == "HND" else "NHD", error_flag=error_flag,
                style=cfg.style, enable_pdl=cfg.extra.get("enable_pdl", False))


# --- running a call and checking everything it wrote ----------------------------------------------

def run_and_check(cfg: Config, device):
    inputs = make_inputs(cfg, device)
    before = {name: (x.cpu().clone() if isinstance(x, torch.Tensor) else x) for name, x in inputs.items()}
    q, k = inputs["query"], inputs["key"]

    def random_like(x):
        return torch.randn(x.shape).to(device=device, dtype=cfg.dtype)

    query_out = random_like(q) if q is not None and cfg.query == "out" else None
    if q is not None and cfg.query == "fp8_out":
        query_out = random_fp8(q.shape).to(device)
    key_out = random_like(k) if cfg.key == "out" else None
    outs_before = [None if x is None else x.cpu().clone() for x in (query_out, key_out)]
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    names = ("query", "key", "value", "positions", "cos_sin_cache", "key_cache", "value_cache", "slot_mapping")
    kvrope_torch.rope_append_(*[inputs[n] for n in names], **kvrope_kwargs(cfg, inputs, query_out, key_out, flag))
    q_rounded = None
    if query_out is not None and cfg.query == "fp8_out":  # the same call, query_out in q's dtype: RoPE(q)_T
        again = make_inputs(cfg, device)
        q_rounded = torch.empty_like(again["query"])
        kw = dict(kvrope_kwargs(cfg, again, q_rounded), q_scale=None)
        kvrope_torch.rope_append_(*[again[n] for n in names], **kw)
        q_rounded = q_rounded.cpu()
    check_outputs(cfg, before, inputs, query_out, key_out, outs_before, flag, q_rounded)


def random_fp8(shape, seed=1):
    """float8_e4m3fn of random bytes, none NaN (what an output held before the call)."""
    x = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return torch.where((x & 0x7F) == 0x7F, 0, x).view(torch.float8_e4m3fn)


def check_outputs(cfg, before, inputs, query_out, key_out, outs_before, flag, q_rounded=None):
    dt, d = cfg.dtype, cfg.head_dim
    r = cfg.rotary_dim or d
    positions, slots = before["positions"].long(), before["slot_mapping"]
    ok = (positions >= 0) & (positions < cfg.max_position)
    table = before["cos_sin_cache"]
    if cfg.mrope:  # positions [3, T]: each token its own row of a table of T rows, composed pair by pair
        table = mrope_rows(table, positions, r, mrope_sections(cfg), cfg.mrope_interleaved)
        ok, positions = ok.all(0), torch.arange(cfg.tokens)
    keep = ok[:, None, None]

    def gold(x, weight):
        x = x.double()
        if weight is not None:
            x = ref_norm(x, weight, before["norm_eps"], before["norm_weight_plus_one"])
        return ref_rope(x, table, positions, cfg.style, r)

    k_gold, k_mag = gold(before["key"], before.get("key_norm_weight"))
    # q: rotated where its position is in range, else as it was; q itself read only with query_out
    if before["query"] is not None and cfg.query == "fp8_out":
        # q_rounded: RoPE(q) as the same call rounds it to q's dtype (query_out in q's dtype), within the
        # tolerance of the float64 value
        q_gold, q_mag = gold(before["query"], before.get("query_norm_weight"))
        assert_close("query_out (in q's dtype)", torch.where(keep, q_rounded.double(), 0), torch.where(keep, q_gold, 0),
                     q_mag, dt)
        got, initial = query_out.cpu().view(torch.uint8), outs_before[0].view(torch.uint8)
        # exact: fp8_satfinite(float(x_T) / q_scale) of that x_T (the fp8 key cache's formula)
        want = reference.fp8_e4m3(q_rounded, before.get("q_scale")).view(torch.uint8)
        assert torch.equal(got[ok], want[ok]), "query_out (fp8): not fp8_satfinite(float(x_T) / q_scale)"
        # exact against the float64 reference (reference.fp8_query: rotated in float64, rounded to q's dtype,
        # quantized): every code on the CPU; on CUDA, whose fp32 math (FMA, rsqrt) may round an element to T
        # the other way (within the tolerance above), every code whose x_T is the float64 value's rounding
        want = reference.fp8_query(before["query"], table, positions, cfg.style, r, before.get("q_scale"),
                                   before.get("query_norm_weight"), before.get("norm_eps", 1e-6),
                                   before.get("norm_weight_plus_one", False)).view(torch.uint8)
        compared = keep & (bits(q_rounded) == bits(q_gold.to(dt)) if query_out.is_cuda else True)
        mismatch = (got != want) & compared
        assert not bool(mismatch.any()), (f"query_out (fp8): {int(mismatch.sum())} codes differ from the reference, "
                                          f"first at {mismatch.nonzero()[0].tolist()}")
        assert torch.equal(got[~ok], initial[~ok]), "query_out: a token out of range was written"
        assert torch.equal(inputs["query"].cpu(), before["query"]), "query changed with query_out given"
    elif before["query"] is not None:
        q_gold, q_mag = gold(before["query"], before.get("query_norm_weight"))
        target = inputs["query"] if query_out is None else query_out
        initial = before["query"] if query_out is None else outs_before[0]
        assert_close("query", torch.where(keep, target.cpu().double(), 0), torch.where(keep, q_gold, 0), q_mag, dt)
        assert torch.equal(target.cpu()[~ok], initial[~ok]), "query: a token out of range was written"
        if query_out is not None:
            assert torch.equal(inputs["query"].cpu(), before["query"]), "query changed with query_out given"
    # k: in place, into key_out, or untouched
    k_written = inputs["key"] if cfg.key == "in_place" else key_out
    if k_written is not None:
        initial = before["key"] if cfg.key == "in_place" else outs_before[1]
        assert_close("key", torch.where(keep, k_written.cpu().double(), 0), torch.where(keep, k_gold, 0), k_mag, dt)
        assert torch.equal(k_written.cpu()[~ok], initial[~ok]), "key: a token out of range was written"
    if cfg.key != "in_place":
        assert torch.equal(inputs["key"].cpu(), before["key"]), "key changed without key_in_place"
    assert torch.equal(inputs["value"].cpu(), before["value"]), "value changed"
    # the caches: the last writing token of each slot, every other row as it was
    num_slots = slot_rows(before["key_cache"], cfg).shape[0]
    writer, expected_flag = {}, 0
    for t in range(cfg.tokens):
        s = int(slots[t])
        if not ok[t]:
            expected_flag |= kvrope_torch.ERROR_POSITION_ID_OUT_OF_RANGE
        elif s >= num_slots:
            expected_flag |= kvrope_torch.ERROR_SLOT_OUT_OF_RANGE
        elif s >= 0:
            writer[s] = t
    assert int(flag) == expected_flag, f"error flag {int(flag)}, expected {expected_flag}"
    written = torch.tensor(sorted(writer), dtype=torch.int64)
    tokens = torch.tensor([writer[s] for s in sorted(writer)], dtype=torch.int64)
    unwritten = torch.ones(num_slots, dtype=torch.bool)
    unwritten[written] = False
    if cfg.cache == "nvfp4":
        k_source = None if k_written is None else k_written.cpu()
        return check_nvfp4_caches(cfg, before, inputs, written, tokens, unwritten, k_source, k_gold)
    fmt = None if cfg.cache == "auto" else FP8[cfg.cache]
    for name, rows_gold, mag, scale_name in (("key_cache", k_gold, k_mag, "k_scale"),
                                             ("value_cache", before["value"].double(), None, "v_scale")):
        out, init = slot_rows(inputs[name], cfg), slot_rows(before[name], cfg)
        if fmt is not None:
            out, init = out.view(torch.uint8), init.view(torch.uint8)
        assert torch.equal(out[unwritten], init[unwritten]), f"{name}: a row no token names was written"
        got = out[written]
        if fmt is None:
            if mag is None:
                assert torch.equal(got, before["value"][tokens]), "value_cache: not a bit-exact copy"
            else:
                assert_close(name, got, rows_gold[tokens], mag[tokens], dt)
            continue
        scale = before.get(scale_name)
        scale = torch.ones(1) if scale is None else scale.reshape(-1)
        scale = scale.float()[:, None]  # [1 or H, 1]
        # exact: fp8_satfinite(float(x_T) / scale) of what the call wrote in T (v, or the rotated k)
        source = before["value"] if mag is None else (None if k_written is None else k_written.cpu())
        if source is not None:
            want = to_fp8(source[tokens].float() / scale, fmt).view(torch.uint8)
            assert torch.equal(got, want), f"{name}: not fp8_satfinite(float(x) / scale) of the T row"
        # within one fp8 step of the float64 value (the rounding to T on the way included)
        g = (rows_gold[tokens] / scale.double()).clamp(-torch.finfo(fmt).max, torch.finfo(fmt).max)
        extra = (ulp(rows_gold[tokens], dt) + (0 if mag is None else 2.0 ** -19 * mag[tokens])) / scale.double()
        assert_close(name, got.view(fmt).double(), g, torch.zeros_like(g), fmt, extra=extra)


def nvfp4_within_a_step(got_codes, got_scales, want_codes, want_scales):
    """Per block (16 values: 8 code bytes, 1 scale byte), whether got is want or one step from it: the scale
    byte within one e4m3 code, each e2m1 magnitude within one code, the signs equal where both are non-zero
    (a GPU's approximate division, or a key rounded to T the other way, moves a block at most that far)."""
    def nibbles(c):
        c = c.long()
        return torch.stack((c & 0xF, c >> 4), -1).flatten(-2)

    g, w = nibbles(got_codes), nibbles(want_codes)
    near = ((g & 7) - (w & 7)).abs() <= 1
    near &= ((g & 8) == (w & 8)) | ((g & 7) == 0) | ((w & 7) == 0)
    near = near.reshape(*near.shape[:-1], -1, 16).all(-1)
    return near & ((got_scales.long() - want_scales.long()).abs() <= 1)


def check_nvfp4_caches(cfg, before, inputs, written, tokens, unwritten, k_written, k_gold):
    """NVFP4 caches: rows no token names as they were (codes and block scales); each written row the
    reference's blocks (reference.nvfp4) of v or of the key the call wrote in T: bit for bit on the CPU (the
    same correctly rounded arithmetic), within a step on CUDA (its approximate division and reciprocal; the
    exact GPU check is tests/gpu/test_append.cu's, FlashInfer's test_nvfp4_matches_flashinfer). Without a key
    output, the float64 key rounded to T, within a step."""
    device_cpu = inputs["key_cache"].device.type == "cpu"
    for name, sf_name, scale_name, source in (("key_cache", "key_cache_sf", "k_scale", k_written),
                                              ("value_cache", "value_cache_sf", "v_scale", before["value"])):
        out, init = slot_rows(inputs[name], cfg), slot_rows(before[name], cfg)
        sf, sf_init = (slot_rows(x, cfg).view(torch.uint8) for x in (inputs[sf_name], before[sf_name]))
        assert torch.equal(out[unwritten], init[unwritten]), f"{name}: a row no token names was written"
        assert torch.equal(sf[unwritten], sf_init[unwritten]), f"{sf_name}: a row no token names was written"
        rows = source[tokens] if source is not None else k_gold[tokens].to(cfg.dtype)
        want, want_sf = reference.nvfp4(rows, before.get(scale_name))
        got, got_sf = out[written], sf[written]
        if device_cpu and source is not None:
            assert torch.equal(got, want), f"{name}: not the reference's NVFP4 codes"
            assert torch.equal(got_sf, want_sf), f"{sf_name}: not the reference's block scales"
        near = nvfp4_within_a_step(got, got_sf, want, want_sf)
        assert bool(near.all()), (f"{name}: {int((~near).sum())} blocks beyond a step of the reference's, the first "
                                  f"at {(~near).nonzero()[0].tolist()}")


# --- torch's fp8 conversion, which the reference relies on ----------------------------------------

def test_torch_fp8_rounding():
    """torch's float -> fp8 rounds to nearest, ties to even (normal and subnormal), and does not saturate:
    the reference clamps to the largest finite value first (fp8_satfinite)."""
    e4m3 = torch.tensor([1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 464.0]).to(torch.float8_e4m3fn).float()
    assert e4m3.tolist() == [1.0, 1.25, 0.0, 2.0 ** -8, 448.0]
    e5m2 = torch.tensor([1.125, 1.375, 2.0 ** -17, 3 * 2.0 ** -17]).to(torch.float8_e5m2).float()
    assert e5m2.tolist() == [1.0, 1.5, 0.0, 2.0 ** -15]
    assert torch.isnan(torch.tensor([480.0]).to(torch.float8_e4m3fn).float()).all()
    assert torch.isinf(torch.tensor([61440.0]).to(torch.float8_e5m2).float()).all()
    assert to_fp8(torch.tensor([1e4, -1e4]), torch.float8_e4m3fn).float().tolist() == [448.0, -448.0]
    assert to_fp8(torch.tensor([1e6]), torch.float8_e5m2).float().tolist() == [57344.0]


# --- the options, one at a time and together ---------------------------------------------------------

CASES = {
    "plain": Config(),
    "interleaved": Config(style="interleaved"),
    "partial": Config(rotary_dim=8),
    "partial_interleaved": Config(rotary_dim=6, style="interleaved"),
    "norm_qk": Config(norm="qk"),
    "norm_k_plus_one": Config(norm="k", style="interleaved"),
    "norm_gemma": Config(norm="plus_one", rotary_dim=8),
    "hnd": Config(layout="HND"),
    "flat": Config(layout="flat", pages=32),
    "kv_one_tensor": Config(layout="kv"),
    "page_of_one": Config(page_size=1, pages=32),
    "fp8_e4m3": Config(cache="fp8_e4m3", extra={"kv_cache_dtype": "auto"}),  # a float8 tensor says
    "fp8_uint8": Config(cache="fp8_e4m3", uint8=True, key="in_place"),
    "fp8_e5m2": Config(cache="fp8_e5m2", key="out"),
    "fp8_e5m2_uint8": Config(cache="fp8_e5m2", uint8=True, scale="tensor"),
    "fp8_scale": Config(cache="fp8_e4m3", scale="tensor", key="in_place"),
    "fp8_scale_per_head": Config(cache="fp8_e4m3", scale="head", layout="HND", key="out"),
    "fp8_norm_per_head": Config(cache="fp8_e5m2", scale="head", norm="qk"),
    "fused_qkv": Config(fused=True, key="in_place"),
    "fused_everything": Config(fused=True, layout="HND", cache="fp8_e4m3", uint8=True, scale="tensor", norm="qk",
                               key="in_place", rotary_dim=8, style="interleaved"),
    "query_out": Config(query="out", key="out"),
    "no_query": Config(query=None, key="in_place"),
    "int32_positions": Config(pos_dtype=torch.int32),
    "fp32_table": Config(table_fp32=True),
    "padded_slots": Config(slots="padded", key="in_place"),
    "repeated_slots": Config(slots="repeated", layout="HND"),
    "slot_out_of_range": Config(slots="out_of_range", key="out"),
    "position_out_of_range": Config(positions="out_of_range", key="in_place", query="out"),
    "one_token": Config(tokens=1),
    "no_tokens": Config(tokens=0),
    "fp8_query_out": Config(query="fp8_out", key="out"),
    "fp8_query_scale": Config(query="fp8_out", q_scale=0.25, rotary_dim=6, style="interleaved"),
    "fp8_query_norm": Config(query="fp8_out", q_scale=3.0, norm="qk", key="in_place"),
    "fp8_query_and_cache": Config(query="fp8_out", q_scale=0.5, cache="fp8_e4m3", scale="tensor", norm="plus_one",
                                  fused=True, rotary_dim=8, key="in_place", positions="out_of_range"),
    # mRoPE: positions [3, T] (Qwen2-VL's sections 16, 24, 24 of 64 pairs, in proportion)
    "mrope": Config(mrope=(2, 3, 3)),
    "mrope_interleaved": Config(mrope=(3, 5, 5), mrope_interleaved=True, stream_pad=3),
    "mrope_gptj_partial": Config(mrope=(2, 3, 3), style="interleaved", rotary_dim=8, key="out", stream_pad=1),
    "mrope_norm_fp8": Config(mrope=(2, 3, 3), mrope_interleaved=True, norm="qk", cache="fp8_e4m3", scale="head",
                             key="in_place", layout="HND"),
    "mrope_out_of_range": Config(mrope=(1, 1, 1), positions="out_of_range", query="out", key="in_place",
                                 pos_dtype=torch.int32),
    "mrope_fp8_query_fused": Config(mrope=(3, 5, 5), query="fp8_out", q_scale=0.5, fused=True, key="in_place",
                                    table_fp32=True, slots="repeated"),
    # NVFP4 (D and R multiples of 32): D = 32, one block a half row
    "nvfp4": Config(cache="nvfp4", head_dim=32, key="out"),
    "nvfp4_scale_hnd": Config(cache="nvfp4", head_dim=32, scale="tensor", layout="HND", key="in_place",
                              style="interleaved", slots="repeated"),
    "nvfp4_per_head_norm": Config(cache="nvfp4", head_dim=32, scale="head", norm="qk", layout="flat", pages=32,
                                  positions="out_of_range"),
    "nvfp4_fused_kv": Config(cache="nvfp4", head_dim=32, fused=True, layout="kv", query="fp8_out", q_scale=0.5,
                             slots="padded", key="out"),
    "nvfp4_no_key_out": Config(cache="nvfp4", head_dim=32, scale="tensor", norm="plus_one"),
    "nvfp4_mrope": Config(cache="nvfp4", head_dim=32, mrope=(2, 3, 3), mrope_interleaved=True, scale="tensor",
                          key="out"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cpu_options(case):
    run_and_check(CASES[case], "cpu")


@pytest.mark.parametrize("case", ["plain", "norm_qk", "fp8_scale", "fused_everything"])
def test_cpu_half_types(case):
    for dtype in (torch.bfloat16, torch.float16):
        run_and_check(replace(CASES[case], dtype=dtype), "cpu")


# --- an fp8 query_out (what fp8 attention reads) ---------------------------------------------------

FP8_QUERY_ROTATIONS = {"rotate_half": dict(), "interleaved": dict(style="interleaved"),
                       "partial": dict(rotary_dim=8), "partial_interleaved": dict(rotary_dim=6, style="interleaved")}


def fp8_query_config(dtype, rotation, norm, q_scale):
    return Config(query="fp8_out", dtype=dtype, q_scale=q_scale, norm="qk" if norm else None, key="in_place",
                  **FP8_QUERY_ROTATIONS[rotation])


@pytest.mark.parametrize("q_scale", [None, 0.375])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rotation", list(FP8_QUERY_ROTATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cpu_fp8_query_out(dtype, rotation, norm, q_scale):
    """A float8_e4m3fn query_out holds, bit for bit, the reference's float64 RoPE(q) rounded to q's dtype
    then fp8_satfinite(x / q_scale) in float32 (reference.fp8_query; pass-through dims too, values beyond
    448 saturated); q is left as it was, k and the caches are written as without it."""
    run_and_check(fp8_query_config(dtype, rotation, norm, q_scale), "cpu")


@needs_cuda
@pytest.mark.parametrize("q_scale", [None, 0.375])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rotation", list(FP8_QUERY_ROTATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_fp8_query_out(dtype, rotation, norm, q_scale):
    cfg = fp8_query_config(dtype, rotation, norm, q_scale)
    run_and_check(replace(cfg, head_dim=128, rotary_dim=cfg.rotary_dim * 8), "cuda")  # vectorized
    run_and_check(cfg, "cuda")
    # more tokens than the few-token kernel takes (kAppendTokenMaxTokens, 1024): the tiled kernel
    run_and_check(replace(cfg, tokens=1500, max_position=1600, pages=400), "cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_query_out_is_the_fp8_key_cache_formula(device):
    """q and k equal (same heads, norm weights and scale): the fp8 query_out rows are the fp8 key cache's
    rows of their slots, byte for byte (one quantization of a rotated row for both)."""
    cfg = Config(query="fp8_out", q_heads=2, cache="fp8_e4m3", scale="tensor", norm="qk", rotary_dim=8)
    inputs = make_inputs(cfg, device)
    inputs["query"].copy_(inputs["key"])
    inputs["query_norm_weight"].copy_(inputs["key_norm_weight"])
    query_out = random_fp8(inputs["query"].shape).to(device)
    args = [inputs[name] for name in ("query", "key", "value", "positions", "cos_sin_cache", "key_cache",
                                      "value_cache", "slot_mapping")]
    kvrope_torch.rope_append_(*args, **dict(kvrope_kwargs(cfg, inputs, query_out), q_scale=inputs["k_scale"]))
    slots = inputs["slot_mapping"].cpu()
    cache = slot_rows(inputs["key_cache"], cfg).view(torch.uint8)
    assert torch.equal(query_out.cpu().view(torch.uint8)[slots >= 0], cache[slots[slots >= 0]])


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_query_out_nonfinite(device):
    """fp8_satfinite: beyond +-448 saturates (infinities too), NaN stays NaN (a NaN rotated spreads to
    its pair); q in fp32, R = 8 of D = 16 (elements 8.. pass through)."""
    cfg = Config(query="fp8_out", tokens=3, rotary_dim=8, q_scale=0.5)
    inputs = make_inputs(cfg, device)
    q = inputs["query"]
    q[0, 0, 8:12] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e6])
    q[1, 1, 0] = float("nan")
    query_out = random_fp8(q.shape).to(device)
    before = q.cpu().clone()
    args = [inputs[name] for name in ("query", "key", "value", "positions", "cos_sin_cache", "key_cache",
                                      "value_cache", "slot_mapping")]
    kvrope_torch.rope_append_(*args, **kvrope_kwargs(cfg, inputs, query_out))
    got = query_out.cpu().float()
    assert torch.isnan(got[0, 0, 8]) and got[0, 0, 9:12].tolist() == [448.0, -448.0, 448.0]
    assert torch.isnan(got[1, 1, 0]) and torch.isnan(got[1, 1, 4])  # rotate-half: the pair (0, R/2)
    want = reference.fp8_query(before, inputs["cos_sin_cache"].cpu(), inputs["positions"].cpu(), cfg.style,
                               scale=inputs["q_scale"].cpu()).float()
    # the finite rest: exact on the CPU, within one e4m3 step on CUDA (its fp32 rounding to T may differ)
    step = (0.125, 2.0 ** -9) if device == "cuda" else (0.0, 0.0)
    torch.testing.assert_close(got, want, rtol=step[0], atol=step[1], equal_nan=True)  # (NaN's sign not compared)


# --- NVFP4 caches --------------------------------------------------------------------------------------

NVFP4_SHAPES = {"d64_partial": dict(head_dim=64, rotary_dim=32), "d128_partial_interleaved":
                dict(head_dim=128, rotary_dim=64, style="interleaved"), "d256": dict(head_dim=256)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", list(NVFP4_SHAPES))
def test_nvfp4_caches(device, dtype, shape):
    """kv_cache_dtype "nvfp4": each written row's blocks are the reference's (check_nvfp4_caches), for the head
    dims and partial rotaries the format takes; on CUDA both kernels (few tokens, and a prefill's tiles)."""
    cfg = Config(cache="nvfp4", dtype=dtype, key="out", scale="head", norm="k", **NVFP4_SHAPES[shape])
    run_and_check(cfg, device)
    run_and_check(replace(cfg, key="in_place", scale=None, layout="HND", slots="padded"), device)
    if device == "cuda":
        run_and_check(replace(cfg, tokens=1500, max_position=1600, pages=400), device)


@functools.lru_cache(maxsize=None)
def flashinfer_nvfp4_append():
    """FlashInfer's NVFP4 append by slot (0.7.4, flashinfer.page), or None where it is not importable. The
    module is loaded as bench/flashinfer_compare.py loads it (FlashInfer's package __init__ imports kernel
    families a reduced wheel lacks: stub packages instead), once a session; its setup:
    dev/scripts/flashinfer_setup.sh."""
    import importlib.util
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "flashinfer_compare.py")
    try:
        spec = importlib.util.spec_from_file_location("kvrope_flashinfer_compare", script)
        compare = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compare)
        page = compare.FlashInfer().page
    except Exception:  # (the script absent, FlashInfer not installed or not loadable here)
        return None
    return getattr(page, "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", None)


@needs_cuda
@pytest.mark.parametrize("tokens", [7, 1500])
@pytest.mark.parametrize("shape", [(64, 64, None), (128, 64, "qk"), (256, 256, "k")])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_matches_flashinfer(dtype, layout, shape, tokens):
    """kvrope's NVFP4 caches are, byte for byte (codes and block scales), what FlashInfer's
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping writes from the rotated k (kvrope's key_out) and v."""
    append = flashinfer_nvfp4_append()
    if append is None:
        pytest.skip("flashinfer is not importable")
    d, r, norm = shape
    cfg = Config(cache="nvfp4", dtype=dtype, head_dim=d, rotary_dim=0 if r == d else r, layout=layout, key="out",
                 norm=norm, scale="tensor", tokens=tokens, max_position=tokens + 64, page_size=16,
                 pages=tokens // 16 + 4, slots="padded", style="rotate_half" if d != 128 else "interleaved")
    inputs = make_inputs(cfg, "cuda")
    theirs = {name: inputs[name].clone() for name in ("key_cache", "value_cache", "key_cache_sf", "value_cache_sf")}
    key_out = torch.empty_like(inputs["key"])
    names = ("query", "key", "value", "positions", "cos_sin_cache", "key_cache", "value_cache", "slot_mapping")
    kvrope_torch.rope_append_(*[inputs[n] for n in names], **kvrope_kwargs(cfg, inputs, key_out=key_out))
    append(key_out, inputs["value"], inputs["slot_mapping"], (theirs["key_cache"], theirs["value_cache"]),
           (theirs["key_cache_sf"], theirs["value_cache_sf"]), inputs["k_scale"], inputs["v_scale"], kv_layout=layout)
    torch.cuda.synchronize()
    for name, want in theirs.items():
        got = inputs[name].view(torch.uint8)
        same = got == want.view(torch.uint8)
        assert bool(same.all()), f"{name}: {int((~same).sum())} bytes differ from FlashInfer's, the first at " \
                                 f"{(~same).nonzero()[0].tolist()}"


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_options(case, dtype):
    cfg = CASES[case]
    # D = 128: the vectorized kernel (D = 16 in fp32 is vectorized too; bf16 / fp16 at D = 16 are not)
    run_and_check(replace(cfg, dtype=dtype, head_dim=128, rotary_dim=cfg.rotary_dim * 8), "cuda")
    run_and_check(replace(cfg, dtype=dtype), "cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["plain", "norm_qk", "fp8_scale", "fused_everything"])
def test_enable_pdl(case, device):
    """enable_pdl (a programmatic dependent launch; the CPU op ignores it) writes what the plain call writes
    (tests/gpu/test_append.cu checks it reads what the kernel before it writes)."""
    cfg = CASES[case]
    run_and_check(replace(cfg, extra=dict(cfg.extra, enable_pdl=True)), device)


@needs_cuda
@pytest.mark.parametrize("seed", range(40))
def test_cuda_random_configurations(seed):
    rng = random.Random(seed)
    d = rng.choice([64, 128, 256, 80, 96, 2 * rng.randint(1, 160)])
    r = rng.choice([0, 0, 2 * rng.randint(1, d // 2)])
    tokens = rng.choice([1, 2, rng.randint(1, 64), rng.randint(64, 700)])
    page_size = rng.choice([1, 16, 32, rng.randint(1, 20)])
    layout = rng.choice(["NHD", "HND", "flat", "kv"])
    pages = (tokens + 10) // (1 if layout == "flat" else page_size) + 2
    cache = rng.choice(["auto", "auto", "fp8_e4m3", "fp8_e5m2"])
    cfg = Config(tokens=tokens, q_heads=rng.choice([0, 1, 4, 8, 14]), heads=rng.choice([1, 2, 8]), head_dim=d,
                 rotary_dim=r, dtype=rng.choice([torch.bfloat16, torch.float16, torch.float32]),
                 style=rng.choice(["rotate_half", "interleaved"]), layout=layout, page_size=page_size, pages=pages,
                 cache=cache, uint8=rng.random() < 0.5, scale=rng.choice([None, "tensor", "head"]) if cache != "auto"
                 else None, norm=rng.choice([None, None, "qk", "k", "plus_one"]), fused=rng.random() < 0.5,
                 key=rng.choice([None, "in_place", "out"]), pos_dtype=rng.choice([torch.int32, torch.int64]),
                 table_fp32=rng.random() < 0.3, slots=rng.choice(["distinct", "padded", "repeated"]),
                 max_position=tokens + 64, seed=seed)
    if cfg.q_heads == 0:
        cfg = replace(cfg, query=None)
    if tokens < 12 and cfg.slots == "repeated":
        cfg = replace(cfg, slots="padded")
    if cfg.query and rng.random() < 0.3:  # drawn last: the configurations above are as they were
        cfg = replace(cfg, query="fp8_out", q_scale=rng.choice([None, 0.5, 3.0]))
    if rng.random() < 0.3:  # mRoPE, drawn after the rest for the same reason
        cfg = replace(cfg, mrope=rng.choice([(2, 3, 3), (3, 5, 5), (rng.randint(0, 4), rng.randint(0, 4), 1)]),
                      mrope_interleaved=rng.random() < 0.5, stream_pad=rng.choice([0, 0, 5]))
    run_and_check(cfg, "cuda")


# --- the vLLM-style function ---------------------------------------------------------------------

def vllm_reference(positions, query, key, value, value_cache, slot_mapping, cos_sin_cache, is_neox, head_size,
                   fmt=None, v_scale=None):
    """vLLM's rotary_embedding then reshape_and_cache_flash, on CPU copies: the rotated query and key in
    float64 (with the tolerance's A) and the new value cache (the key cache is checked against the key
    the call leaves, which is checked against this one)."""
    n = positions.numel()
    style = "rotate_half" if is_neox else "interleaved"
    r = cos_sin_cache.shape[1]
    q = ref_rope(query.double().reshape(n, -1, head_size), cos_sin_cache, positions, style, r)
    k = ref_rope(key.double().reshape(n, -1, head_size), cos_sin_cache, positions, style, r)
    vc, block = value_cache.clone(), value_cache.shape[1]
    for t in range(slot_mapping.numel()):
        s = int(slot_mapping[t])
        if s >= 0:
            row = value.reshape(n, -1, head_size)[t]
            if fmt is not None:
                row = to_fp8(row.float() / (1.0 if v_scale is None else v_scale.float()), fmt)
            (vc if fmt is None else vc.view(fmt))[s // block, s % block] = row
    return q, k, vc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["neox_2d", "gptj_3d_partial", "fused_qkv", "fp8_uint8", "fp8_float8_scale",
                                     "auto_with_scales", "padded_for_graph"])
def test_rotary_embedding_and_cache(device, variant):
    g = torch.Generator().manual_seed(3)
    n, hq, h, d, block, blocks = 11, 4, 2, 32, 16, 4
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    is_neox = variant != "gptj_3d_partial"
    r = 16 if variant == "gptj_3d_partial" else d
    angles = torch.arange(50, dtype=torch.float64)[:, None] * (1.0 / 10000 ** (torch.arange(0, r, 2) / r))[None]
    cos_sin_cache = torch.cat((angles.cos(), angles.sin()), -1).to(dt)
    positions = torch.randint(0, 50, (n,), generator=g)
    slot_mapping = torch.randperm(block * blocks, generator=g)[:n]
    slot_mapping[2] = -1
    if variant == "fused_qkv":
        qkv = torch.randn(n, (hq + 2 * h) * d, generator=g).to(dt)
        query, key, value = qkv.split([hq * d, h * d, h * d], dim=-1)
        value = value.view(n, h, d)
    else:
        query, key, value = (torch.randn(n, x * d, generator=g).to(dt) for x in (hq, h, h))
        value = value.view(n, h, d)
    if variant == "gptj_3d_partial":
        query, key = query.view(n, hq, d), key.view(n, h, d)
    fmt, kind, cache_dtype, k_scale, v_scale = None, "auto", dt, None, None
    if variant == "fp8_uint8":
        fmt, kind, cache_dtype = torch.float8_e4m3fn, "fp8", torch.uint8
        k_scale, v_scale = torch.tensor(0.5), torch.tensor(1.5)
    elif variant == "fp8_float8_scale":
        fmt, kind, cache_dtype = torch.float8_e5m2, "fp8_e5m2", torch.float8_e5m2
        k_scale, v_scale = torch.tensor([0.25]), torch.tensor([4.0])
    elif variant == "auto_with_scales":  # vLLM passes its scales always; a cache in T ignores them
        k_scale, v_scale = torch.tensor(0.5), torch.tensor(0.5)
    if fmt is not None:
        key_cache = torch.randint(0, 0x70, (blocks, block, h, d), generator=g, dtype=torch.uint8).view(cache_dtype)
    else:
        key_cache = torch.randn(blocks, block, h, d, generator=g).to(dt)
    value_cache = key_cache.clone()
    slots_given = slot_mapping[:8] if variant == "padded_for_graph" else slot_mapping
    m = slots_given.numel()
    gold_q, gold_k, gold_vc = vllm_reference(positions[:m], query[:m], key[:m], value[:m], value_cache, slots_given,
                                             cos_sin_cache, is_neox, d, fmt, v_scale)
    q0, k0 = query.clone(), key.clone()
    given = (positions, query, key, value, key_cache, value_cache, slots_given, cos_sin_cache, k_scale, v_scale)
    on = [x.clone().to(device) if x is not None else None for x in given]
    if variant == "fused_qkv":  # keep the views into one tensor on the device
        qkv_dev = qkv.to(device)
        on[1], on[2], v_dev = qkv_dev.split([hq * d, h * d, h * d], dim=-1)
        on[3] = v_dev.view(n, h, d)
    positions_d, query_d, key_d, value_d, kc_d, vc_d, slots_d, table_d, ks_d, vs_d = on
    kvrope_torch.rotary_embedding_and_cache(positions_d, query_d, key_d, value_d, kc_d, vc_d, slots_d, table_d,
                                            is_neox, kind, ks_d, vs_d, head_size=d)
    got_q, got_k = query_d.cpu().reshape(n, hq, d), key_d.cpu().reshape(n, h, d)
    assert_close("query", got_q[:m], gold_q[0], gold_q[1], dt)
    assert_close("key", got_k[:m], gold_k[0], gold_k[1], dt)
    assert torch.equal(got_q[m:], q0.reshape(n, hq, d)[m:]), "padding tokens past slot_mapping were touched"
    assert torch.equal(got_k[m:], k0.reshape(n, h, d)[m:]), "padding tokens past slot_mapping were touched"
    # the key cache holds the key the call left in T (checked above), quantized for fp8: exact
    kc_ref = key_cache.clone()
    for t in range(m):
        s = int(slots_given[t])
        if s >= 0:
            row = got_k[t] if fmt is None else to_fp8(got_k[t].float() / k_scale.float().reshape(-1), fmt)
            (kc_ref if fmt is None else kc_ref.view(fmt))[s // block, s % block] = row
    assert torch.equal(raw(kc_d.cpu()), raw(kc_ref)), "key_cache"
    assert torch.equal(raw(vc_d.cpu()), raw(gold_vc)), "value_cache"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True])
def test_rotary_embedding_and_cache_fp8_query_out(device, padded):
    """query_out in fp8 (what fp8 attention reads): RoPE(q) quantized with q_scale as rope_append_ does,
    query left as it was, past a short slot_mapping query_out left as it was too; key and the caches as
    without query_out."""
    g = torch.Generator().manual_seed(5)
    n, hq, h, d, block, blocks = 11, 4, 2, 32, 16, 4
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    angles = torch.arange(50, dtype=torch.float64)[:, None] * (1.0 / 10000 ** (torch.arange(0, d, 2) / d))[None]
    table = torch.cat((angles.cos(), angles.sin()), -1).to(dt)
    positions = torch.randint(0, 50, (n,), generator=g)
    slots = torch.randperm(block * blocks, generator=g)[:8 if padded else n]
    slots[2] = -1
    query, key = (torch.randn(n, x * d, generator=g).to(dt) for x in (hq, h))
    value = torch.randn(n, h, d, generator=g).to(dt)
    key_cache = torch.randn(blocks, block, h, d, generator=g).to(dt)
    q_scale = torch.tensor([0.75])
    query_out = random_fp8((n, hq * d))
    m = slots.numel()
    given = [x.to(device) for x in (positions, query, key, value, key_cache, key_cache.clone(), slots, table)]
    plain = [x.clone() for x in given]
    out_d = query_out.to(device)
    kvrope_torch.rotary_embedding_and_cache(*given, True, query_out=out_d, q_scale=q_scale.to(device))
    kvrope_torch.rotary_embedding_and_cache(*plain, True)
    assert torch.equal(given[1].cpu(), query), "query changed with query_out given"
    got = out_d.cpu().view(torch.uint8)
    # exact: the query the call without query_out rotates in place, quantized
    want = reference.fp8_e4m3(plain[1].cpu()[:m], q_scale).view(torch.uint8)
    assert torch.equal(got[:m], want), "query_out (fp8): not fp8_satfinite(float(RoPE(q)_T) / q_scale)"
    if device == "cpu":  # and the float64 reference, code for code (CUDA: see check_outputs)
        want = reference.fp8_query(query[:m].view(m, hq, d), table, positions[:m], "rotate_half", scale=q_scale)
        assert torch.equal(got[:m], want.view(torch.uint8).reshape(m, hq * d)), "query_out (fp8)"
    assert torch.equal(got[m:], query_out.view(torch.uint8)[m:]), "padding tokens past slot_mapping were touched"
    for name, x, y in (("key", given[2], plain[2]), ("key_cache", given[4], plain[4]),
                       ("value_cache", given[5], plain[5])):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_rotary_embedding_and_cache_mrope(device, interleaved, padded):
    """vLLM's MRotaryEmbedding call: positions [3, T] (a view of wider streams) with Qwen2-VL's sections
    (16, 24, 24) or Qwen3-VL's interleaved (24, 20, 20) at D = 128; query and key rotated in place with each
    pair's angle from its stream's row, the caches as the key the call leaves and v; past a short
    slot_mapping (padding for a graph) the tokens are left as they are."""
    g = torch.Generator().manual_seed(7)
    n, hq, h, d, block, blocks = 9, 4, 2, 128, 16, 2
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    sections = [24, 20, 20] if interleaved else [16, 24, 24]
    angles = torch.arange(60, dtype=torch.float64)[:, None] * (1.0 / 10000 ** (torch.arange(0, d, 2) / d))[None]
    table = torch.cat((angles.cos(), angles.sin()), -1).to(dt)
    positions = torch.randint(0, 60, (3, n + 2), generator=g)[:, :n]
    slots = torch.randperm(block * blocks, generator=g)[:6 if padded else n]
    query, key = (torch.randn(n, x * d, generator=g).to(dt) for x in (hq, h))
    value = torch.randn(n, h, d, generator=g).to(dt)
    key_cache = torch.randn(blocks, block, h, d, generator=g).to(dt)
    m = slots.numel()
    rows = mrope_rows(table, positions[:, :m], d, sections, interleaved)  # token t's row: rows[t]
    gold_q, gold_k, gold_vc = vllm_reference(torch.arange(m), query[:m], key[:m], value[:m], key_cache.clone(), slots,
                                             rows, True, d)
    given = [x.to(device) for x in (positions, query, key, value, key_cache, key_cache.clone(), slots, table)]
    given[0] = torch.zeros(3, n + 2, dtype=torch.int64, device=device)[:, :n].copy_(positions)  # stride n + 2
    kvrope_torch.rotary_embedding_and_cache(*given, True, mrope_section=sections, mrope_interleaved=interleaved)
    got_q, got_k = given[1].cpu().reshape(n, hq, d), given[2].cpu().reshape(n, h, d)
    assert_close("query", got_q[:m], gold_q[0], gold_q[1], dt)
    assert_close("key", got_k[:m], gold_k[0], gold_k[1], dt)
    assert torch.equal(got_q[m:], query.reshape(n, hq, d)[m:]), "padding tokens past slot_mapping were touched"
    kc_ref = key_cache.clone()
    for t in range(m):
        kc_ref[int(slots[t]) // block, int(slots[t]) % block] = got_k[t]
    assert torch.equal(given[4].cpu(), kc_ref), "key_cache"
    assert torch.equal(given[5].cpu(), gold_vc), "value_cache"


def test_rotary_embedding_and_cache_shapes():
    n, d = 3, 8
    table = torch.cat((torch.ones(4, 4), torch.zeros(4, 4)), -1)
    kc = torch.zeros(2, 4, 2, d)
    args = lambda q: (torch.zeros(n, dtype=torch.int64), q, torch.zeros(n, 2 * d), torch.zeros(n, 2, d), kc,  # noqa
                      kc.clone(), torch.arange(n), table, True)
    with pytest.raises(ValueError, match=r"query of shape \[3, 20\] is not \[T=3, heads \* 8\]"):
        kvrope_torch.rotary_embedding_and_cache(*args(torch.zeros(n, 20)))
    with pytest.raises(ValueError, match="has no \\[T, heads, 8\\] view"):
        kvrope_torch.rotary_embedding_and_cache(*args(torch.zeros(n, 2, 2 * d).transpose(0, 1)))
    with pytest.raises(ValueError, match="slot_mapping has 4 tokens, positions 3"):
        kvrope_torch.rotary_embedding_and_cache(*args(torch.zeros(n, 2 * d))[:6], torch.arange(4), table, True)
    # positions [3, T] without mrope_section are 3 T tokens: positions is named, with the hint (it was query)
    streams = torch.zeros(3, n, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"positions of shape \[3, 3\] gives 9 tokens, query 3; .* pass mrope_section"):
        kvrope_torch.rotary_embedding_and_cache(streams, *args(torch.zeros(n, 2 * d))[1:])
    with pytest.raises(ValueError, match=r"positions of shape \[4\] gives 4 tokens, query 3$"):
        kvrope_torch.rotary_embedding_and_cache(torch.arange(4), *args(torch.zeros(n, 2 * d))[1:])


# --- errors, the check option, the flag -------------------------------------------------------------

def fp8_like(x):
    return torch.empty_like(x, dtype=torch.float8_e4m3fn)


def small_call(device, **cfg):
    cfg = Config(tokens=5, pages=4, **cfg)
    inputs = make_inputs(cfg, device)
    args = [inputs[name] for name in ("query", "key", "value", "positions", "cos_sin_cache", "key_cache",
                                      "value_cache", "slot_mapping")]
    return args, kvrope_kwargs(cfg, inputs)


BAD_CALLS = [  # (what to change, the error, its message)
    (lambda a, k: a.__setitem__(1, a[1].double() if a[1].is_cuda else a[1].int()), TypeError,
     "tensors must be bfloat16, float16, float32"),
    (lambda a, k: a.__setitem__(1, a[1][:, :, :7]), ValueError, "head_dim must be even"),
    (lambda a, k: a.__setitem__(1, a[1].flatten(1)), ValueError, r"key must be \[T, H, D\]"),
    (lambda a, k: a.__setitem__(2, a[2].half()), TypeError, "value is .*, key .*: every float tensor has one dtype"),
    (lambda a, k: a.__setitem__(2, a[2][:4]), ValueError, r"value has shape \[4, 2, 16\], expected \[5, 2, 16\]"),
    (lambda a, k: a.__setitem__(0, a[0][:, :, :8]), ValueError, r"query must be \[T, Hq, D\] with T=5, D=16"),
    (lambda a, k: a.__setitem__(0, a[0].transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
     "query's last dim must be contiguous"),
    (lambda a, k: a.__setitem__(3, a[3].float()), TypeError, "positions must be int32 or int64"),
    (lambda a, k: a.__setitem__(7, a[7].int()), TypeError, "slot_mapping must be int64"),
    (lambda a, k: a.__setitem__(7, a[7][:4]), ValueError, r"slot_mapping has shape \[4\], expected \[5\]"),
    (lambda a, k: a.__setitem__(4, a[4][:, :5]), ValueError, r"cos_sin_cache must be \[max_pos, R\] with R even"),
    (lambda a, k: a.__setitem__(4, a[4].t().contiguous().t()), ValueError, "cos_sin_cache must be contiguous"),
    (lambda a, k: a.__setitem__(4, a[4].half()), TypeError, "cos_sin_cache must be on key's device, in its dtype"),
    (lambda a, k: a.__setitem__(5, a[5].transpose(1, 2)), ValueError,
     r"key_cache has shape \[4, 2, 4, 16\], expected \[4, 2, 2, 16\] \(an HND cache"),
    (lambda a, k: a.__setitem__(5, a[5][0, 0]), ValueError, r"key_cache must be \[pages, P, H, D\] or \[slots, H, D\]"),
    (lambda a, k: a.__setitem__(6, a[6][:3]), ValueError, r"value_cache has shape \[3, 4, 2, 16\], expected"),
    (lambda a, k: a.__setitem__(6, a[6].half()), TypeError, "the caches have one dtype"),
    (lambda a, k: a.__setitem__(5, a[5].int()), TypeError, "key_cache must be key's dtype"),
    (lambda a, k: (a.__setitem__(5, a[5].to(torch.uint8)), a.__setitem__(6, a[6].to(torch.uint8))), ValueError,
     "a uint8 cache needs kv_cache_dtype 'fp8', 'fp8_e4m3', 'fp8_e5m2' or 'nvfp4'"),
    (lambda a, k: k.update(kv_cache_dtype="fp8"), TypeError, "kv_cache_dtype 'fp8' does not match key_cache's dtype"),
    (lambda a, k: k.update(kv_cache_dtype="int8"), ValueError, "kv_cache_dtype must be 'auto', 'fp8'"),
    (lambda a, k: k.update(k_scale=torch.ones((), device=a[1].device)), ValueError,
     "k_scale needs an fp8 or NVFP4 cache"),
    (lambda a, k: k.update(key_out=torch.empty_like(a[1]), key_in_place=True), ValueError,
     "key_in_place and key_out exclude each other"),
    (lambda a, k: k.update(key_out=torch.empty_like(a[1])[:, :1]), ValueError, "key_out has shape"),
    (lambda a, k: k.update(query_out=torch.empty_like(a[0]).half()), TypeError, "query_out is"),
    (lambda a, k: k.update(key_norm_weight=torch.ones(8, device=a[1].device)), ValueError,
     r"key_norm_weight has shape \[8\], expected \[16\]"),
    (lambda a, k: k.update(norm_eps=-1.0), ValueError, "norm_eps must be a non-negative number"),
    (lambda a, k: k.update(error_flag=torch.zeros(2, dtype=torch.int32, device=a[1].device)), ValueError,
     "error_flag must be an int32 tensor of one element"),
    (lambda a, k: k.update(style="neox"), ValueError, "style must be 'rotate_half' or 'interleaved'"),
    (lambda a, k: k.update(layout="NDH"), ValueError, "layout must be 'NHD' or 'HND'"),
    # an fp8 query_out (float8_e4m3fn) and its q_scale
    (lambda a, k: k.update(q_scale=torch.ones((), device=a[1].device)), ValueError,
     r"q_scale needs an fp8 query_out \(float8_e4m3fn\)"),
    (lambda a, k: k.update(query_out=torch.empty_like(a[0]), q_scale=torch.ones((), device=a[1].device)),
     ValueError, "q_scale needs an fp8 query_out"),
    (lambda a, k: k.update(query_out=fp8_like(a[0]), q_scale=torch.ones((), device=a[1].device,
                                                                         dtype=torch.float64)),
     TypeError, "q_scale must be float32, not"),
    (lambda a, k: k.update(query_out=fp8_like(a[0]), q_scale=torch.ones(2, device=a[1].device)), ValueError,
     r"q_scale must have one element, got \[2\]"),
    (lambda a, k: k.update(query_out=fp8_like(a[0])[:, :1]), ValueError,
     r"query_out has shape \[5, 1, 16\], expected \[5, 4, 16\]"),
    (lambda a, k: k.update(query_out=fp8_like(a[0]).transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
     "query_out's last dim must be contiguous"),
    (lambda a, k: k.update(query_out=torch.empty_like(a[0], dtype=torch.float8_e5m2)), TypeError,
     "query_out is .*8_e5m2: an fp8 query_out must be float8_e4m3fn"),
]
BAD_FP8_CALLS = [
    (lambda a, k: k.update(k_scale=torch.ones(3, device=a[1].device)), ValueError,
     r"k_scale must have one element or shape \[H\] \(H=2\), got \[3\]"),
    (lambda a, k: k.update(k_scale=torch.ones(2, device=a[1].device, dtype=torch.float64)), TypeError,
     "k_scale must be float32"),
    (lambda a, k: k.update(k_scale=torch.ones(2, device=a[1].device), v_scale=torch.ones(1, device=a[1].device)),
     ValueError, "k_scale and v_scale must both be per-tensor or both per-head"),
    (lambda a, k: k.update(kv_cache_dtype="fp8_e5m2"), TypeError, "kv_cache_dtype 'fp8_e5m2' does not match"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
def test_errors_are_clear(device, fp8):
    """Every argument checked before any work, by one copy of the checks (csrc/checks.cpp) on CUDA and CPU
    alike, with the same messages; nothing is written by a failing call."""
    for change, error, message in (BAD_FP8_CALLS if fp8 else BAD_CALLS):
        args, kwargs = small_call(device, cache="fp8_e4m3" if fp8 else "auto")
        before = [a.clone() for a in args]
        change(args, kwargs)
        with pytest.raises(error, match=message):
            kvrope_torch.rope_append_(*args, **kwargs)
        for a, b in zip(args, before):
            if a.shape == b.shape and a.dtype == b.dtype:
                assert torch.equal(raw(a), raw(b))


@needs_cuda
def test_cuda_overlapping_outputs_are_refused():
    """kvrope's validate() checks what shapes cannot say, before any launch: outputs overlapping each
    other or an input, and an output whose rows overlap, the fields named."""
    args, kwargs = small_call("cuda")
    q, v = args[0], args[2]
    before = [raw(a).clone() for a in args]
    with pytest.raises(RuntimeError, match=r"kvrope.rope_append_: output overlaps another buffer \(.*key_out"):
        kvrope_torch.rope_append_(*args, **dict(kwargs, key_out=q[:, :2]))  # and q, rotated in place
    with pytest.raises(RuntimeError, match=r"kvrope.rope_append_: output overlaps another buffer \(.*value"):
        kvrope_torch.rope_append_(*args, **dict(kwargs, key_out=v))
    with pytest.raises(RuntimeError, match=r"kvrope.rope_append_: output rows overlap \(query_out.head_stride\)"):
        kvrope_torch.rope_append_(*args, **dict(kwargs, query_out=torch.empty_like(q[:, :1]).expand_as(q)))
    # an fp8 query_out (kvrope's query_out_fp8) is named as the argument, its scale read on the device
    with pytest.raises(RuntimeError, match=r"kvrope.rope_append_: output rows overlap \(query_out.head_stride\)"):
        kvrope_torch.rope_append_(*args, **dict(kwargs, query_out=fp8_like(q[:, :1]).expand_as(q)))
    with pytest.raises(ValueError, match="kvrope: q_scale is on cpu, key on cuda:0"):
        kvrope_torch.rope_append_(*args, **dict(kwargs, query_out=fp8_like(q), q_scale=torch.ones(1)))
    assert all(torch.equal(raw(a), b) for a, b in zip(args, before)), "a refused call wrote"


@pytest.mark.parametrize("device", DEVICES)
def test_check_option(device):
    """check=True reads the flag after the call (a synchronization) and raises, naming the argument."""
    for kind, message in (("slots", "slot_mapping holds a slot at or above num_pages \\* page_size = 16"),
                          ("positions", r"positions holds a position outside \[0, max_position=40\)")):
        cfg = dict(slots="out_of_range") if kind == "slots" else dict(positions="out_of_range")
        args, kwargs = small_call(device, **cfg)
        with pytest.raises(ValueError, match=message):
            kvrope_torch.rope_append_(*args, **dict(kwargs, check=True))
        flag = torch.zeros(1, dtype=torch.int32, device=device)  # without check: only the flag says
        kvrope_torch.rope_append_(*args, **dict(kwargs, error_flag=flag))
        assert int(flag) != 0
    args, kwargs = small_call(device)
    kvrope_torch.rope_append_(*args, **dict(kwargs, check=True))  # in range: no error


# --- torch's contract: opcheck, the fake kernel, torch.compile, versions -----------------------------

OPCHECK_CASES = ["plain", "fused_everything", "fp8_e5m2_uint8", "fp8_e4m3", "fp8_e5m2", "query_out", "no_query", "flat",
                 "position_out_of_range", "fp8_query_out", "fp8_query_and_cache", "mrope", "mrope_out_of_range",
                 "nvfp4_scale_hnd", "nvfp4_fused_kv"]


def op_args(cfg, device, dtype):
    """The op's own arguments (torch.ops.kvrope.rope_append_) for `cfg`: an HND cache as its NHD view."""
    inputs = make_inputs(replace(cfg, dtype=dtype), device)
    kw = kvrope_kwargs(cfg, inputs, error_flag=torch.zeros(1, dtype=torch.int32, device=device))
    if cfg.query == "out" and inputs["query"] is not None:
        kw["query_out"] = torch.empty_like(inputs["query"])
    if cfg.query == "fp8_out" and inputs["query"] is not None:
        kw["query_out"] = fp8_like(inputs["query"])
    if cfg.key == "out":
        kw["key_out"] = torch.empty_like(inputs["key"])
    kc, vc = inputs["key_cache"], inputs["value_cache"]
    if kw.pop("layout") == "HND":
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
        for name in ("key_cache_sf", "value_cache_sf"):
            if kw.get(name) is not None:
                kw[name] = kw[name].transpose(1, 2)
    kw["style"] = 0 if kw["style"] == "rotate_half" else 1
    args = (inputs["query"], inputs["key"], inputs["value"], inputs["positions"], inputs["cos_sin_cache"], kc, vc,
            inputs["slot_mapping"])
    return args, kw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck(device, case):
    """torch's checks of the op: its schema (what it mutates), the fake kernel against the real one,
    and AOT dispatch (torch.compile's functionalization of the mutations)."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    cfg = CASES[case]
    args, kwargs = op_args(cfg, device, dtype)
    # torch's schema check compares tensors with allclose, which has no float8 kernels: float8 caches
    # and an fp8 query_out skip it (the uint8 cases run the same kernels through it)
    skip = ("test_schema",) if (cfg.cache != "auto" and not cfg.uint8) or cfg.query == "fp8_out" else ()
    tests = tuple(t for t in ("test_schema", "test_autograd_registration", "test_faketensor",
                              "test_aot_dispatch_dynamic") if t not in skip)
    torch.library.opcheck(torch.ops.kvrope.rope_append_.default, args, kwargs, test_utils=tests)


class DispatchCalls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
def test_api_calls_the_op(device):
    """The API calls the op from C++ (kvrope_torch._C) or through torch.ops: the same results; modes see
    kvrope.rope_append_; the versions of exactly the tensors written are bumped."""
    args, kwargs = op_args(CASES["fused_everything"], device, torch.float32)
    clones = lambda xs: [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]  # noqa: E731
    a1, a2 = clones(args), clones(args)
    names = ["query_out", "key_out", "key_in_place", "query_norm_weight", "key_norm_weight", "norm_eps",
             "norm_weight_plus_one", "kv_cache_dtype", "k_scale", "v_scale", "error_flag", "rotary_dim", "style",
             "q_scale", "enable_pdl", "mrope_section", "mrope_interleaved", "key_cache_sf", "value_cache_sf"]
    rest = [kwargs.get(name, default) for name, default in zip(
        names, [None, None, False, None, None, 1e-6, False, "auto", None, None, None, 0, 0, None, False, [], False,
                None, None])]
    kvrope_torch._C.rope_append_(*a1, *rest)
    torch.ops.kvrope.rope_append_.default(*a2, **kwargs)
    for x, y in zip(a1, a2):
        if isinstance(x, torch.Tensor):
            assert torch.equal(raw(x), raw(y))
    mode = DispatchCalls()
    with mode:
        kvrope_torch.rope_append_(*clones(args), kv_cache_dtype="fp8")
    assert "kvrope.rope_append_.default" in mode.seen
    with pytest.raises(TypeError, match="kvrope.rope_append_: norm_eps must be a float, not str"):
        kvrope_torch._C.rope_append_(*args, *rest[:5], "x", *rest[6:])
    with pytest.raises(TypeError, match="kvrope.rope_append_: kv_cache_dtype must be a str, not int"):
        kvrope_torch._C.rope_append_(*args, *rest[:7], 8, *rest[8:])
    with pytest.raises(TypeError, match="kvrope.rope_append_: mrope_section must be a list of ints, not int"):
        kvrope_torch._C.rope_append_(*args, *rest[:15], 3, *rest[16:])
    with pytest.raises(TypeError, match="kvrope.rope_append_: mrope_section must be a list of ints, not one holding"):
        kvrope_torch._C.rope_append_(*args, *rest[:15], [1.0, 2, 3], *rest[16:])
    with pytest.raises(TypeError, match="kvrope.rope_append_ takes 27 arguments, not 8"):
        kvrope_torch._C.rope_append_(*args)
    with pytest.raises(TypeError, match="kvrope.rope_append_: q_scale must be a tensor, not float"):
        kvrope_torch._C.rope_append_(*args, *rest[:13], 1.0, *rest[14:])
    # versions: q, the caches, the flag; k only with key_in_place
    q, k, v, _, _, kc, vc, _ = args = clones(args)
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    before = [x._version for x in (q, k, v, kc, vc, flag)]
    kvrope_torch.rope_append_(*args, kv_cache_dtype="fp8", error_flag=flag)
    after = [x._version for x in (q, k, v, kc, vc, flag)]
    assert [a > b for a, b in zip(after, before)] == [True, False, False, True, True, True]
    kvrope_torch.rope_append_(*args, kv_cache_dtype="fp8", key_in_place=True)
    assert k._version > after[1]
    # an fp8 query_out: it is bumped, q is not
    query_out, q_version = fp8_like(q), q._version
    kvrope_torch.rope_append_(*args, kv_cache_dtype="fp8", query_out=query_out,
                              q_scale=torch.ones(1, device=device))
    assert query_out._version > 0 and q._version == q_version


def test_compile_matches_eager():
    """torch.compile traces the op with its fake kernel and functionalizes its mutations: the same
    outputs as eager, for the API and the vLLM-style function."""
    def step(args, kwargs):
        q, k = args[0], args[1]
        kvrope_torch.rope_append_(*args, **kwargs)
        return q * 2, k + 1

    cfg = CASES["fused_everything"]
    args, kwargs = small_call("cpu", **{f: getattr(cfg, f) for f in ("fused", "layout", "cache", "uint8", "scale",
                                                                       "norm", "key", "rotary_dim", "style")})
    a_eager = [x.clone() for x in args]
    a_compiled = [x.clone() for x in args]
    out_eager = step(a_eager, kwargs)
    out_compiled = torch.compile(step, fullgraph=True)(a_compiled, kwargs)
    for x, y in zip(list(out_eager) + a_eager, list(out_compiled) + a_compiled):
        assert torch.equal(raw(x), raw(y))

    def vllm_step(positions, q, k, v, kc, vc, slots, table):
        kvrope_torch.rotary_embedding_and_cache(positions, q.flatten(1), k, v, kc, vc, slots, table, True)
        return q.sum()

    args, _ = small_call("cpu")
    a_eager = [x.clone() for x in args]
    a_compiled = [x.clone() for x in args]
    order = lambda a: (a[3], a[0], a[1], a[2], a[5], a[6], a[7], a[4])  # noqa: E731
    torch.testing.assert_close(vllm_step(*order(a_eager)), torch.compile(vllm_step, fullgraph=True)(*order(a_compiled)))
    for x, y in zip(a_eager, a_compiled):
        assert torch.equal(x, y)


def test_compile_fp8_query_out():
    """torch.compile with an fp8 query_out: the fake kernel, and the functionalized mutation of a
    float8_e4m3fn tensor; the same bytes as eager."""
    args, kwargs = small_call("cpu", query="fp8_out", q_scale=0.5, norm="qk", key="in_place")

    def step(args, kwargs, query_out):
        kvrope_torch.rope_append_(*args, **dict(kwargs, query_out=query_out))
        return args[1] + 1

    query_out = random_fp8(args[0].shape)
    a_eager, a_compiled = [x.clone() for x in args], [x.clone() for x in args]
    out_eager, out_compiled = query_out.clone(), query_out.clone()
    r_eager = step(a_eager, kwargs, out_eager)
    r_compiled = torch.compile(step, fullgraph=True)(a_compiled, kwargs, out_compiled)
    assert torch.equal(r_eager, r_compiled)
    assert torch.equal(raw(out_eager), raw(out_compiled))
    assert not torch.equal(raw(out_eager), raw(query_out)), "query_out not written"
    for x, y in zip(a_eager, a_compiled):
        assert torch.equal(raw(x), raw(y))


def test_compiled_errors_are_clear():
    args, kwargs = small_call("cpu")
    args[7] = args[7].int()
    with pytest.raises(Exception, match="slot_mapping must be int64"):
        torch.compile(lambda *a: kvrope_torch.rope_append_(*a, **kwargs), fullgraph=True)(*args)
    # check=True reads the flag outside the graph (a graph break): still raises, with the message
    args, kwargs = small_call("cpu", slots="out_of_range")
    with pytest.raises(ValueError, match="slot_mapping holds a slot at or above"):
        torch.compile(lambda *a: kvrope_torch.rope_append_(*a, **kwargs, check=True))(*args)


# --- CUDA graphs ------------------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("case", ["fused_everything", "padded_slots", "fp8_scale_per_head"])
def test_cuda_graph_capture_and_replay(case):
    """Captured once, replayed on new tokens, positions and slots copied into the static inputs: the same
    as eager each time. No synchronization or allocation in the call (capture would fail)."""
    cfg = replace(CASES[case], dtype=torch.bfloat16, head_dim=128, rotary_dim=CASES[case].rotary_dim * 8)
    static = make_inputs(cfg, "cuda")
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    names = ("query", "key", "value", "positions", "cos_sin_cache", "key_cache", "value_cache", "slot_mapping")

    def call(inputs, error_flag):
        kvrope_torch.rope_append_(*[inputs[n] for n in names], **kvrope_kwargs(cfg, inputs, error_flag=error_flag))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(static, flag)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(static, flag)
        with pytest.raises(ValueError, match="check=True reads the error flag .* not under CUDA graph capture"):
            kvrope_torch.rope_append_(*[static[n] for n in names], check=True)
    for seed in (1, 2):  # new inputs copied into the static ones; eager on inputs of the same layout
        fresh = make_inputs(replace(cfg, seed=seed), "cuda")
        for name, x in fresh.items():
            if isinstance(x, torch.Tensor):
                static[name].copy_(x)
        flag.zero_()
        graph.replay()
        call(fresh, None)
        torch.cuda.synchronize()
        for name in ("query", "key", "key_cache", "value_cache"):
            if static[name] is not None:
                assert torch.equal(raw(static[name]), raw(fresh[name])), name


@needs_cuda
def test_cuda_graph_vllm_function():
    """rotary_embedding_and_cache captured as vLLM captures its decode step: padded slots (-1)."""
    n, hq, h, d = 8, 8, 2, 128
    qkv = torch.randn(n, (hq + 2 * h) * d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([hq * d, h * d, h * d], dim=-1)
    positions = torch.arange(n, device="cuda")
    slots = torch.arange(n, device="cuda")
    slots[-2:] = -1
    table = torch.randn(64, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.zeros(4, 16, h, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    args = (positions, q, k, v.view(n, h, d), kc, vc, slots, table, True)
    ref = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    kvrope_torch.rotary_embedding_and_cache(*ref)
    graph = torch.cuda.CUDAGraph()
    qkv0 = qkv.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kvrope_torch.rotary_embedding_and_cache(*args)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        kvrope_torch.rotary_embedding_and_cache(*args)
    qkv.copy_(qkv0)
    kc.zero_()
    vc.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q, ref[1]) and torch.equal(k, ref[2])
    assert torch.equal(kc, ref[4]) and torch.equal(vc, ref[5])
    assert not kc[0, 6:8].any(), "padded slots wrote a row"


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_and_cache_names_a_wrong_head_size(device):
    """A head_size that is not the caches' D is named as such (it was blamed on cos_sin_cache)."""
    n, hq, h, d = 3, 4, 2, 32
    positions = torch.arange(n, device=device)
    query, key = (torch.randn(n, x * d, device=device) for x in (hq, h))
    value = torch.randn(n, h, d, device=device)
    key_cache = torch.randn(2, 16, h, d, device=device)
    table = torch.randn(8, d, device=device)
    with pytest.raises(ValueError, match="head_size 16 differs from the caches' D = 32"):
        kvrope_torch.rotary_embedding_and_cache(positions, query, key, value, key_cache, key_cache.clone(),
                                                torch.arange(n, device=device), table, True, head_size=16)
