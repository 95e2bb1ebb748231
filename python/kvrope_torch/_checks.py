"""The argument checks of the CPU and fake ops (check_forward, check_forward_, check_backward), before any
work: an error names the argument (TypeError for a dtype, ValueError otherwise). The twin of the CUDA ops'
checks in C++ (csrc/checks.cpp), with the same messages: a CUDA call pays no Python for them, and a fake
op checks shapes that may be symbolic, which C++ sizes() cannot read."""
from typing import Tuple

import torch

_CUDA_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CPU_DTYPES = _CUDA_DTYPES + (torch.float64,)


# The tensor the others are compared with (its dtype, its device): its name and itself.
Like = Tuple[str, torch.Tensor]


def _dims(shape) -> str:  # "[2, 3, 9, 8]", as the C++ checks print a shape
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _check_last_dim(name: str, x: torch.Tensor) -> None:
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"kvrope: {name}'s last dim must be contiguous (stride 1), not {x.stride(-1)}")


def _check_rows(name: str, x: torch.Tensor, like: Like, shape) -> None:
    like_name, like_x = like
    if x.device != like_x.device:
        raise ValueError(f"kvrope: {name} is on {x.device}, {like_name} on {like_x.device}")
    if x.dtype != like_x.dtype:
        raise TypeError(f"kvrope: {name} is {x.dtype}, {like_name} {like_x.dtype}: every float tensor has one dtype")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"kvrope: {name} has shape {_dims(x.shape)}, expected {_dims(shape)}")
    _check_last_dim(name, x)


def _check_positions(name: str, p: torch.Tensor, like: Like, s: int, batch: int = 0) -> None:
    """Positions [S], or also [B, S] where batch > 0."""
    like_name, like_x = like
    if p.device != like_x.device:
        raise ValueError(f"kvrope: {name} is on {p.device}, {like_name} on {like_x.device}")
    if p.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"kvrope: {name} must be int32 or int64, not {p.dtype}")
    if tuple(p.shape) != (s,) and (batch == 0 or tuple(p.shape) != (batch, s)):
        batched = f" or [{batch}, {s}]" if batch > 0 else ""
        raise ValueError(f"kvrope: {name} has shape {_dims(p.shape)}, expected [{s}]{batched}")
    if p.numel() > 0 and p.stride(-1) != 1:
        raise ValueError(f"kvrope: {name} must be contiguous")


def _first_rows(name: str, x: torch.Tensor, dims: str) -> Tuple[int, int, int, int]:
    """The sizes of the call's first tensor of head rows, whose dtype and device the others must share;
    its last dim contiguous."""
    if x.dim() != 4:
        raise ValueError(f"kvrope: {name} must be [{dims}], got {_dims(x.shape)}")
    if x.dtype not in (_CUDA_DTYPES if x.is_cuda else _CPU_DTYPES):
        also = "" if x.is_cuda else " or float64"
        raise TypeError(f"kvrope: {name} is {x.dtype}: {x.device.type} tensors must be bfloat16, float16, float32{also}")
    if x.shape[3] % 2:
        raise ValueError(f"kvrope: head_dim must be even, not {x.shape[3]}")
    _check_last_dim(name, x)
    return tuple(x.shape)


def _check_heads(k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 cache_position: torch.Tensor) -> Tuple[int, int, int, int, int]:
    b, h, s, d = _first_rows("key_states", k, "B, H, S, D")
    like = ("key_states", k)
    if key_cache.dim() != 4:
        raise ValueError(f"kvrope: key_cache must be [B, H, S_max, D], got {_dims(key_cache.shape)}")
    s_max = key_cache.shape[2]
    _check_rows("value_states", v, like, (b, h, s, d))
    _check_rows("key_cache", key_cache, like, (b, h, s_max, d))
    _check_rows("value_cache", value_cache, like, (b, h, s_max, d))
    _check_positions("cache_position", cache_position, like, s)
    return b, h, s, s_max, d


def check_tables_given(cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Both per-token tables given (the API's one check: a schema's Tensor cannot say it)."""
    if cos is None or sin is None:
        raise ValueError("kvrope: give cos and sin (per-token tables), or cos_sin_cache and position_ids")


def _check_tables(cos: torch.Tensor, sin: torch.Tensor, like: Like, b: int, s: int, d: int) -> None:
    check_tables_given(cos, sin)
    if cos.dim() != 3 or cos.shape[0] not in (1, b) or cos.shape[1] != s:
        raise ValueError(f"kvrope: cos must be [B, S, R] or [1, S, R] with B={b}, S={s}, got {_dims(cos.shape)}")
    r = cos.shape[2]
    if r % 2 or r == 0 or r > d:
        raise ValueError(f"kvrope: the rotary dim R = cos.shape[-1] must be even and in (0, D={d}], not {r}")
    _check_rows("cos", cos, like, cos.shape)
    _check_rows("sin", sin, like, cos.shape)


def _check_rotation(rotary_dim: int, style: int, table: torch.Tensor) -> None:
    """The ops' rotary_dim (0: the tables' R, or R itself) and style (0 rotate-half, 1 interleaved)."""
    if table is not None and rotary_dim not in (0, table.shape[-1]):
        raise ValueError(f"kvrope: rotary_dim {rotary_dim} differs from the tables' R = {table.shape[-1]}")
    if style not in (0, 1):
        raise ValueError(f"kvrope: style must be 0 (rotate_half) or 1 (interleaved), not {style}")


def check_forward(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, rotary_dim,
                  style) -> None:
    b, _, s, _, d = _check_heads(key_states, value_states, key_cache, value_cache, cache_position)
    _check_tables(cos, sin, ("key_states", key_states), b, s, d)
    _check_rotation(rotary_dim, style, cos)


def check_forward_(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, cos_sin_cache,
                   position_ids, query, query_out, key_out, error_flag, rotary_dim, style) -> None:
    b, h, s, s_max, d = _check_heads(key_states, value_states, key_cache, value_cache, cache_position)
    like = ("key_states", key_states)
    if cos_sin_cache is not None:
        if cos is not None or sin is not None:
            raise ValueError("kvrope: give either cos and sin or cos_sin_cache, not both")
        if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] % 2 or not 0 < cos_sin_cache.shape[1] <= d:
            raise ValueError(f"kvrope: cos_sin_cache must be [max_pos, R] with R even in (0, D={d}], "
                             f"got {_dims(cos_sin_cache.shape)}")
        if cos_sin_cache.dtype not in (key_states.dtype, torch.float32) or cos_sin_cache.device != key_states.device:
            raise TypeError("kvrope: cos_sin_cache must be on key_states' device, in its dtype or float32")
        if not cos_sin_cache.is_contiguous():
            raise ValueError("kvrope: cos_sin_cache must be contiguous")
        if position_ids is None:
            raise ValueError("kvrope: cos_sin_cache needs position_ids")
        _check_positions("position_ids", position_ids, like, s, b)
        if position_ids.dtype != cache_position.dtype:
            raise TypeError("kvrope: position_ids and cache_position must have one dtype")
    else:
        _check_tables(cos, sin, like, b, s, d)
    if query is not None:
        if query.dim() != 4 or query.shape[0] != b or query.shape[2] != s or query.shape[3] != d:
            raise ValueError(f"kvrope: query must be [B, Hq, S, D] with B={b}, S={s}, D={d}, got {_dims(query.shape)}")
        _check_rows("query", query, like, query.shape)
        if query_out is not None:
            _check_rows("query_out", query_out, like, query.shape)
    elif query_out is not None:
        raise ValueError("kvrope: query_out needs query")
    if key_out is not None:
        _check_rows("key_out", key_out, like, key_states.shape)
    if error_flag is not None and (error_flag.dtype != torch.int32 or error_flag.numel() != 1 or
                                   error_flag.device != key_states.device):
        raise ValueError("kvrope: error_flag must be an int32 tensor of one element on key_states' device")
    _check_rotation(rotary_dim, style, cos if cos is not None else cos_sin_cache)


def check_backward(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim, style,
                   table_grads) -> None:
    b, h, s_max, d = _first_rows("grad_key_cache", grad_key_cache, "B, H, S_max, D")
    like = ("grad_key_cache", grad_key_cache)
    _check_rows("grad_value_cache", grad_value_cache, like, (b, h, s_max, d))
    if cache_position.dim() != 1:
        raise ValueError(f"kvrope: cache_position must be [S], got {_dims(cache_position.shape)}")
    # S from the tables (cos [B or 1, S, R]), as the forward takes it from key_states: a cache_position of
    # another length is then named as such.
    s = cos.shape[1] if cos is not None and cos.dim() == 3 else cache_position.shape[0]
    _check_positions("cache_position", cache_position, like, s)
    _check_tables(cos, sin, like, b, s, d)
    if table_grads:
        if key_states is None:
            raise ValueError("kvrope: table gradients need key_states")
        _check_rows("key_states", key_states, like, (b, h, s, d))
    _check_rotation(rotary_dim, style, cos)


# --- the serving forward (kvrope::rope_append_) ------------------------------------------------------

_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# The float8 formats other than e4m3fn (c10::isFloat8Type's, as the C++ check names them)
_OTHER_FP8 = (torch.float8_e5m2, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz, torch.float8_e8m0fnu)
_FLOAT_MAX = 3.4028234663852886e38


def _check_on_device(name: str, x: torch.Tensor, like: Like) -> None:
    like_name, like_x = like
    if x.device != like_x.device:
        raise ValueError(f"kvrope: {name} is on {x.device}, {like_name} on {like_x.device}")


def cache_format(key_cache: torch.Tensor, dtype: torch.dtype, kv_cache_dtype: str):
    """The caches' element type: None for q's dtype, else torch.float8_e4m3fn or torch.float8_e5m2
    (a float8 cache, or a uint8 one whose format kv_cache_dtype names)."""
    if kv_cache_dtype not in _KV_CACHE_DTYPES:
        raise ValueError(f"kvrope: kv_cache_dtype must be 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2', "
                         f"not '{kv_cache_dtype}'")
    e4m3, e5m2 = kv_cache_dtype in ("fp8", "fp8_e4m3"), kv_cache_dtype == "fp8_e5m2"
    c = key_cache.dtype
    if c == torch.uint8:
        if not (e4m3 or e5m2):
            raise ValueError("kvrope: a uint8 cache needs kv_cache_dtype 'fp8', 'fp8_e4m3' or 'fp8_e5m2', not 'auto'")
        return torch.float8_e4m3fn if e4m3 else torch.float8_e5m2
    if c not in (dtype, torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"kvrope: key_cache must be key's dtype ({dtype}), float8_e4m3fn, float8_e5m2 or uint8, "
                        f"not {c}")
    fmt = None if c == dtype else c
    if not (kv_cache_dtype == "auto" or (fmt == torch.float8_e4m3fn and e4m3) or (fmt == torch.float8_e5m2 and e5m2)):
        raise TypeError(f"kvrope: kv_cache_dtype '{kv_cache_dtype}' does not match key_cache's dtype {c}")
    return fmt


def _check_scale(name: str, s: torch.Tensor, like: Like, h: int, fmt) -> bool:
    """A per-tensor scale (one element) or per-head scales [H], float32; True when per head."""
    if fmt is None:
        raise ValueError(f"kvrope: {name} needs an fp8 cache")
    if s.dtype != torch.float32:
        raise TypeError(f"kvrope: {name} must be float32, not {s.dtype}")
    _check_on_device(name, s, like)
    one, per_head = s.dim() <= 1 and s.numel() == 1, tuple(s.shape) == (h,)
    if not (one or per_head):
        raise ValueError(f"kvrope: {name} must have one element or shape [H] (H={h}), got {_dims(s.shape)}")
    if not s.is_contiguous():
        raise ValueError(f"kvrope: {name} must be contiguous")
    return not one


def _check_query_out(out: torch.Tensor, q: torch.Tensor, like: Like) -> None:
    """The append's query_out: q's dtype, or float8_e4m3fn (what fp8 attention reads); q's shape, on its
    device, the last dim contiguous. An fp8 of another format is refused by name (e4m3 only)."""
    if out.dtype != torch.float8_e4m3fn:
        if out.dtype in _OTHER_FP8:
            raise TypeError(f"kvrope: query_out is {out.dtype}: an fp8 query_out must be float8_e4m3fn")
        _check_rows("query_out", out, like, q.shape)
        return
    _check_on_device("query_out", out, like)
    if tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"kvrope: query_out has shape {_dims(out.shape)}, expected {_dims(q.shape)}")
    _check_last_dim("query_out", out)


def _check_q_scale(s: torch.Tensor, query_out, like: Like) -> None:
    """query_out's per-tensor scale (stored = fp8_satfinite(x / q_scale)): an fp8 query_out's only,
    float32, one element on the device."""
    if query_out is None or query_out.dtype != torch.float8_e4m3fn:
        raise ValueError("kvrope: q_scale needs an fp8 query_out (float8_e4m3fn)")
    if s.dtype != torch.float32:
        raise TypeError(f"kvrope: q_scale must be float32, not {s.dtype}")
    _check_on_device("q_scale", s, like)
    if s.numel() != 1:
        raise ValueError(f"kvrope: q_scale must have one element, got {_dims(s.shape)}")


def check_error_flag(error_flag, like: Like) -> None:
    like_name, like_x = like
    if error_flag is not None and (error_flag.dtype != torch.int32 or error_flag.numel() != 1 or
                                   error_flag.device != like_x.device):
        raise ValueError(f"kvrope: error_flag must be an int32 tensor of one element on {like_name}'s device")


def check_append(query, key, value, positions, cos_sin_cache, key_cache, value_cache, slot_mapping, query_out,
                 key_out, key_in_place, query_norm_weight, key_norm_weight, norm_eps, norm_weight_plus_one,
                 kv_cache_dtype, k_scale, v_scale, error_flag, rotary_dim, style, q_scale):
    """The twin of csrc/checks.cpp's check_append; returns the caches' fp8 format (None: q's dtype)."""
    if key.dim() != 3:
        raise ValueError(f"kvrope: key must be [T, H, D], got {_dims(key.shape)}")
    if key.dtype not in (_CUDA_DTYPES if key.is_cuda else _CPU_DTYPES):
        also = "" if key.is_cuda else " or float64"
        raise TypeError(f"kvrope: key is {key.dtype}: {key.device.type} tensors must be bfloat16, float16, float32{also}")
    n, h, d = key.shape
    if d % 2:
        raise ValueError(f"kvrope: head_dim must be even, not {d}")
    _check_last_dim("key", key)
    like = ("key", key)
    _check_rows("value", value, like, (n, h, d))
    if query is not None:
        if query.dim() != 3 or query.shape[0] != n or query.shape[2] != d:
            raise ValueError(f"kvrope: query must be [T, Hq, D] with T={n}, D={d}, got {_dims(query.shape)}")
        _check_rows("query", query, like, query.shape)
        if query_out is not None:
            _check_query_out(query_out, query, like)
    else:
        if query_out is not None:
            raise ValueError("kvrope: query_out needs query")
        if query_norm_weight is not None:
            raise ValueError("kvrope: query_norm_weight needs query")
    if q_scale is not None:
        _check_q_scale(q_scale, query_out, like)
    if key_out is not None:
        if key_in_place:
            raise ValueError("kvrope: key_in_place and key_out exclude each other")
        _check_rows("key_out", key_out, like, (n, h, d))
    _check_positions("positions", positions, like, n)
    _check_on_device("slot_mapping", slot_mapping, like)
    if slot_mapping.dtype != torch.int64:
        raise TypeError(f"kvrope: slot_mapping must be int64, not {slot_mapping.dtype}")
    if tuple(slot_mapping.shape) != (n,):
        raise ValueError(f"kvrope: slot_mapping has shape {_dims(slot_mapping.shape)}, expected [{n}]")
    if not slot_mapping.is_contiguous():
        raise ValueError("kvrope: slot_mapping must be contiguous")
    c = cos_sin_cache
    if c.dim() != 2 or c.shape[1] % 2 or not 0 < c.shape[1] <= d:
        raise ValueError(f"kvrope: cos_sin_cache must be [max_pos, R] with R even in (0, D={d}], got {_dims(c.shape)}")
    if c.dtype not in (key.dtype, torch.float32) or c.device != key.device:
        raise TypeError("kvrope: cos_sin_cache must be on key's device, in its dtype or float32")
    if not c.is_contiguous():
        raise ValueError("kvrope: cos_sin_cache must be contiguous")
    kc = key_cache
    if kc.dim() not in (3, 4):
        raise ValueError(f"kvrope: key_cache must be [pages, P, H, D] or [slots, H, D], got {_dims(kc.shape)}")
    shape = tuple(kc.shape[:-2]) + (h, d)
    _check_on_device("key_cache", kc, like)
    if tuple(kc.shape) != shape:
        raise ValueError(f"kvrope: key_cache has shape {_dims(kc.shape)}, expected {_dims(shape)} "
                         "(an HND cache [pages, H, P, D] as its transpose(1, 2))")
    fmt = cache_format(kc, key.dtype, kv_cache_dtype)
    _check_on_device("value_cache", value_cache, like)
    if value_cache.dtype != kc.dtype:
        raise TypeError(f"kvrope: value_cache is {value_cache.dtype}, key_cache {kc.dtype}: the caches have one dtype")
    if tuple(value_cache.shape) != tuple(kc.shape):
        raise ValueError(f"kvrope: value_cache has shape {_dims(value_cache.shape)}, expected {_dims(kc.shape)}")
    _check_last_dim("key_cache", kc)
    _check_last_dim("value_cache", value_cache)
    per_head = [None, None]
    if k_scale is not None:
        per_head[0] = _check_scale("k_scale", k_scale, like, h, fmt)
    if v_scale is not None:
        per_head[1] = _check_scale("v_scale", v_scale, like, h, fmt)
    if None not in per_head and per_head[0] != per_head[1]:
        raise ValueError("kvrope: k_scale and v_scale must both be per-tensor or both per-head")
    for name, w in (("query_norm_weight", query_norm_weight), ("key_norm_weight", key_norm_weight)):
        if w is not None:
            _check_rows(name, w, like, (d,))
    if not 0 <= norm_eps <= _FLOAT_MAX:
        raise ValueError(f"kvrope: norm_eps must be a non-negative number, not {norm_eps:f}")
    check_error_flag(error_flag, like)
    _check_rotation(rotary_dim, style, c)
    return fmt
