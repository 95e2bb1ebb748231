"""The op's math in plain torch (docs/spec.md sections 1 and 2): the CPU implementations of the ops
and the autograd term of RoPE(k) are built on it. Computes in fp32, or fp64 for fp64 inputs, and
rounds each output to the input's dtype once."""
from typing import Optional, Tuple

import torch

ROTATE_HALF, INTERLEAVED = 0, 1


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rotate(x: torch.Tensor, style: int) -> torch.Tensor:
    """rot(x) over the last dim (the rotated part): out = x * cos + rot(x) * sin."""
    if style == ROTATE_HALF:
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def rotate_adjoint(g: torch.Tensor, style: int) -> torch.Tensor:
    """The adjoint of rotate: <rotate(x), g> = <x, rotate_adjoint(g)>."""
    if style == ROTATE_HALF:
        h = g.shape[-1] // 2
        return torch.cat((g[..., h:], -g[..., :h]), dim=-1)
    return torch.stack((g[..., 1::2], -g[..., 0::2]), dim=-1).flatten(-2)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: int) -> torch.Tensor:
    """RoPE of head rows x [B, H, S, D] (compute dtype) with tables [B or 1, S, R]; elements R.. pass."""
    r = cos.shape[-1]
    c, s = cos[:, None], sin[:, None]
    xr = x[..., :r]
    return torch.cat((xr * c + rotate(xr, style) * s, x[..., r:]), dim=-1)


def rope_backward(g: torch.Tensor, k: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, style: int,
                  table_grads: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Given the gradient g of RoPE(k) [B, H, S, D]: the gradient of k and, with table_grads, of cos and
    sin, summed over the heads (and over the batch when the tables have batch 1)."""
    r = cos.shape[-1]
    c, s = cos[:, None], sin[:, None]
    gr = g[..., :r]
    gk = torch.cat((gr * c + rotate_adjoint(gr * s, style), g[..., r:]), dim=-1)
    if not table_grads:
        return gk, None, None
    kr = k[..., :r]
    gcos, gsin = (gr * kr).sum(1), (gr * rotate(kr, style)).sum(1)
    if cos.shape[0] == 1:
        gcos, gsin = gcos.sum(0, keepdim=True), gsin.sum(0, keepdim=True)
    return gk, gcos, gsin


def rows_of(cache_position: torch.Tensor, cache_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each token's cache row (negatives wrap) and whether it is in [-S_max, S_max)."""
    p = cache_position.to(torch.int64)
    p = torch.where(p < 0, p + cache_len, p)
    valid = (p >= 0) & (p < cache_len)
    return torch.where(valid, p, torch.zeros_like(p)), valid


def last_writers(rows: torch.Tensor, writes: torch.Tensor, cache_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The rows written and, for each, the last token that names it among those that write."""
    tokens = torch.arange(rows.numel(), device=rows.device)
    last = torch.full((max(cache_len, 1),), -1, dtype=torch.int64, device=rows.device)
    last = last.scatter_reduce(0, rows[writes], tokens[writes], reduce="amax", include_self=True)
    written = torch.nonzero(last >= 0).flatten()
    return written, last[written]


def tables_from_cache(cos_sin_cache: torch.Tensor, position_ids: torch.Tensor, batch: int, style: int,
                      dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token tables [B, S, R] from a table cache [max_pos, R] (cos | sin, one angle a pair) and
    position ids [S] or [B, S]; and whether each token's id is in range ([B, S])."""
    r = cos_sin_cache.shape[-1]
    ids = position_ids.to(torch.int64)
    if ids.dim() == 1:
        ids = ids[None].expand(batch, -1)
    ok = (ids >= 0) & (ids < cos_sin_cache.shape[0])
    rows = cos_sin_cache.to(dtype)[torch.where(ok, ids, torch.zeros_like(ids))]  # [B, S, R]
    e = torch.arange(r, device=cos_sin_cache.device)
    pair = e % (r // 2) if style == ROTATE_HALF else e // 2
    return rows[..., pair], rows[..., r // 2 + pair], ok


def mrope_streams(section, interleaved: bool, pairs: int) -> torch.Tensor:
    """mRoPE (docs/spec.md section 6.2): the stream of positions [3, T] each of the R/2 pairs takes its angle
    from. Contiguous sections: 0 below s0, 1 below s0 + s1, else 2; interleaved (Qwen3-VL): 1 where
    i % 3 == 1 and i < 3 s1, 2 where i % 3 == 2 and i < 3 s2, else 0."""
    i = torch.arange(pairs)
    if interleaved:
        height = (i % 3 == 1) & (i < 3 * section[1])
        width = (i % 3 == 2) & (i < 3 * section[2])
        return torch.where(height, 1, torch.where(width, 2, 0))
    return (i >= section[0]).long() + (i >= section[0] + section[1]).long()


def mrope_tables_from_cache(cos_sin_cache: torch.Tensor, positions: torch.Tensor, section, interleaved: bool,
                            style: int, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token tables [1, T, R] from a table cache and positions [3, T] (mRoPE): each pair's angle from
    the row of its stream's position; and whether all three positions of each token are in range ([1, T])."""
    r = cos_sin_cache.shape[-1]
    cos, sin, ok = tables_from_cache(cos_sin_cache, positions, 3, style, dtype)  # [3, T, R]: a row a stream
    e = torch.arange(r)
    pair = e % (r // 2) if style == ROTATE_HALF else e // 2
    stream = mrope_streams(section, interleaved, r // 2)[pair].to(cos.device)
    index = stream[None, None, :].expand(1, cos.shape[1], r)
    return cos.gather(0, index), sin.gather(0, index), ok.all(0, keepdim=True)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, plus_one: bool) -> torch.Tensor:
    """Per-head RMSNorm over the last dim (compute dtype): x rsqrt(mean(x^2) + eps) w, w -> 1 + w if plus_one."""
    w = weight + 1 if plus_one else weight
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


def to_fp8(x: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """x rounded to fp8 as the kernel's __NV_SATFINITE conversion does: to nearest even, finite values
    saturated at the format's largest (torch's own conversion gives NaN or inf beyond it)."""
    big = torch.finfo(fmt).max
    return x.clamp(-big, big).to(fmt)


_MIN_NORMAL = 2.0 ** -126


def _ftz(x: torch.Tensor) -> torch.Tensor:
    """fp32's flush to zero: a subnormal becomes a zero of its sign (what NVFP4's fast-math arithmetic does)."""
    return torch.where(x.abs() < _MIN_NORMAL, torch.copysign(torch.zeros_like(x), x), x)


def to_nvfp4(x: torch.Tensor, g: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 blocks of rows x [..., H, D] (docs/spec.md section 6.4, FlashInfer 0.7.4's rule) under the global
    scale g (None: 1; one element, or [H]): (codes [..., H, D / 2] uint8, even element in the low nibble;
    block scales [..., H, D / 16] uint8, e4m3). In fp32 with subnormals flushed, the division and the
    reciprocal correctly rounded (the GPU's approximate ones may differ by an ulp, and so, rarely, a block)."""
    f32 = torch.float32
    x = _ftz(x.to(f32))
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    g = torch.ones((), dtype=f32) if g is None else g.to(device=x.device, dtype=f32).reshape(-1, 1)
    amax = torch.nan_to_num(blocks.abs(), nan=0.0).amax(-1)  # NaN skipped
    live = (amax >= _MIN_NORMAL) & (g >= _MIN_NORMAL)
    divisor = _ftz(6.0 * g)  # fl(6 g)
    q = torch.where(divisor > 2.0 ** 126, torch.where(amax.isinf(), float("nan"), 0.0), _ftz(amax / divisor))
    q = torch.where(live, q, torch.zeros_like(q))
    code = to_fp8(q, torch.float8_e4m3fn)
    s = code.to(f32)
    r = torch.where(live & (s > 0), _ftz(1.0 / _ftz(s * g)), torch.zeros_like(s))
    y = _ftz(blocks * r[..., None])
    a = y.abs()
    magnitude = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() + (a > 2.5).int()
                 + (a >= 3.5).int() + (a > 5.0).int())
    sign = torch.where(y.isnan(), 0, torch.signbit(y).int() * 8)
    nibbles = (sign | magnitude).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    codes = (nibbles[..., 0] | (nibbles[..., 1] << 4)).to(torch.uint8)
    return codes, code.view(torch.uint8)
