"""The kvrope ops' CPU implementations, fake (meta) implementations and autograd. The schemas and the
CUDA implementations are in the C++ extension (csrc/ops.cpp)."""

import torch

from . import _C  # registers the schemas and the CUDA kernels; its check_* are the ops' checks
from . import _math as m

ops = torch.ops.kvrope
ERROR_POSITION_OUT_OF_RANGE, ERROR_POSITION_ID_OUT_OF_RANGE, ERROR_SLOT_OUT_OF_RANGE = 1, 2, 4
# The caches' element type by _C.check_append's answer (csrc/ops.h's CacheType): None for q's dtype.
_CACHE_FORMATS = (None, torch.float8_e4m3fn, torch.float8_e5m2, "nvfp4")


# --- CPU implementations: the semantics of docs/spec.md, in plain torch ---------------------------
# They and the fake implementations check their arguments first with the CUDA ops' checks (csrc/checks.cpp,
# as _C.check_*: one copy, one set of messages), the fake ones so that a compiled function's bad call fails
# as clearly at its trace (unless its shapes are symbolic: then the op checks it when it runs).

def _forward_cpu_into(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, cos_sin_cache,
                      position_ids, query, query_out, key_out, error_flag, style):
    ct = m.compute_dtype(key_states.dtype)
    batch, cache_len = key_states.shape[0], key_cache.shape[2]
    seq = cache_position.shape[0]
    if cos_sin_cache is not None:
        cos, sin, ids_ok = m.tables_from_cache(cos_sin_cache, position_ids, batch, style, ct)
    else:
        cos, sin = cos.to(ct), sin.to(ct)
        ids_ok = torch.ones(batch, seq, dtype=torch.bool)
    rows, in_range = m.rows_of(cache_position, cache_len)
    flag = 0
    if bool((~in_range).any()):
        flag |= ERROR_POSITION_OUT_OF_RANGE
    if bool((~ids_ok).any()):
        flag |= ERROR_POSITION_ID_OUT_OF_RANGE
    if error_flag is not None and flag:
        error_flag.bitwise_or_(flag)
    k_rot = m.rope(key_states.to(ct), cos, sin, style).to(key_states.dtype)
    keep = ids_ok[:, None, :, None]  # a token with a bad position id writes nothing at all
    if key_out is not None:
        key_out.copy_(torch.where(keep, k_rot, key_out))
    if query is not None:
        q_rot = m.rope(query.to(ct), cos, sin, style).to(query.dtype)
        target = query_out if query_out is not None else query
        target.copy_(torch.where(keep, q_rot, target))
    for b in range(batch):
        written, tokens = m.last_writers(rows, in_range & ids_ok[b], cache_len)
        key_cache[b][:, written] = k_rot[b][:, tokens]
        value_cache[b][:, written] = value_states[b][:, tokens]


@torch.library.impl("kvrope::forward_", "cpu")
def _forward_inplace_cpu(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, cos_sin_cache,
                         position_ids, query, query_out, key_out, error_flag, rotary_dim=0, style=0):
    _C.check_forward_(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, cos_sin_cache,
                      position_ids, query, query_out, key_out, error_flag, rotary_dim, style)
    _forward_cpu_into(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, cos_sin_cache,
                      position_ids, query, query_out, key_out, error_flag, style)


@torch.library.impl("kvrope::forward", "cpu")
def _forward_cpu(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, rotary_dim=0, style=0):
    _C.check_forward(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, rotary_dim, style)
    kc, vc, ko = key_cache.clone(), value_cache.clone(), torch.empty_like(key_states)
    _forward_cpu_into(key_states, value_states, kc, vc, cache_position, cos, sin, None, None, None, None, ko, None,
                      style)
    return kc, vc, ko


def _backward_cpu_parts(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim, style,
                        table_grads):
    _C.check_backward(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim, style,
                      table_grads)
    ct = m.compute_dtype(grad_key_cache.dtype)
    dtype, cache_len = grad_key_cache.dtype, grad_key_cache.shape[2]
    rows, in_range = m.rows_of(cache_position, cache_len)
    mask = in_range[None, None, :, None]
    g = torch.where(mask, grad_key_cache[:, :, rows], 0)  # a token out of range gets zeros
    gk, gc, gs = m.rope_backward(g.to(ct), None if key_states is None else key_states.to(ct), cos.to(ct), sin.to(ct),
                                 style, table_grads)
    gv = torch.where(mask, grad_value_cache[:, :, rows], 0)
    empty = cos.new_empty(0)
    gc = gc.to(dtype).contiguous() if table_grads else empty
    gs = gs.to(dtype).contiguous() if table_grads else empty
    return gk.to(dtype).contiguous(), gv.contiguous(), gc, gs, rows[in_range]


@torch.library.impl("kvrope::backward", "cpu")
def _backward_cpu(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim=0, style=0,
                  table_grads=True):
    gk, gv, gc, gs, named = _backward_cpu_parts(grad_key_cache, grad_value_cache, key_states, cos, sin,
                                                cache_position, rotary_dim, style, table_grads)
    gkc = grad_key_cache.clone(memory_format=torch.contiguous_format)
    gvc = grad_value_cache.clone(memory_format=torch.contiguous_format)
    gkc[:, :, named] = 0
    gvc[:, :, named] = 0
    return gk, gv, gc, gs, gkc, gvc


@torch.library.impl("kvrope::backward_", "cpu")
def _backward_inplace_cpu(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim=0,
                          style=0, table_grads=True):
    gk, gv, gc, gs, named = _backward_cpu_parts(grad_key_cache, grad_value_cache, key_states, cos, sin,
                                                cache_position, rotary_dim, style, table_grads)
    grad_key_cache[:, :, named] = 0
    grad_value_cache[:, :, named] = 0
    return gk, gv, gc, gs


def _fp8_bytes(rows, scale, fmt, ct):
    """fp8_satfinite(float(x_T) / scale) as uint8 codes, x_T rows [T, heads, D] already rounded to their
    dtype; scale None (1), one element, or [heads] (per head). The fp8 caches and an fp8 query_out."""
    x = rows.to(ct)
    if scale is not None:
        x = x / scale.reshape(-1, 1).to(ct)
    return m.to_fp8(x, fmt).view(torch.uint8)


def _slot_writes(slots, ok, num_slots, page_size, error_flag):
    """The cache rows a serving append writes, as (pages, offsets, tokens): each slot in range named by a token
    whose position is (ok), its last such token. Raises the error flag's bits: a bad position, a slot past the
    cache."""
    flag = ERROR_POSITION_ID_OUT_OF_RANGE if bool((~ok).any()) else 0
    if bool(((slots >= num_slots) & ok).any()):
        flag |= ERROR_SLOT_OUT_OF_RANGE
    if error_flag is not None and flag:
        error_flag.bitwise_or_(flag)
    written, tokens = m.last_writers(slots, (slots >= 0) & (slots < num_slots) & ok, num_slots)
    return written // page_size, written % page_size, tokens


@torch.library.impl("kvrope::rope_append_", "cpu")
def _append_cpu(query, key, value, positions, cos_sin_cache, key_cache, value_cache, slot_mapping, query_out=None,
                key_out=None, key_in_place=False, query_norm_weight=None, key_norm_weight=None, norm_eps=1e-6,
                norm_weight_plus_one=False, kv_cache_dtype="auto", k_scale=None, v_scale=None, error_flag=None,
                rotary_dim=0, style=0, q_scale=None, enable_pdl=False, mrope_section=(), mrope_interleaved=False,
                key_cache_sf=None, value_cache_sf=None):
    """The serving forward (docs/spec.md section 6). A token whose position is out of range writes nothing;
    a negative or out-of-range slot writes no cache row; the last token naming a slot wins. A float8_e4m3fn
    query_out gets RoPE(q) quantized as the fp8 caches are (one formula: _fp8_bytes); NVFP4 caches get their
    rows' blocks (m.to_nvfp4, correctly rounded: the GPU's approximate division may differ, rarely, by a step)."""
    fmt = _CACHE_FORMATS[_C.check_append(query, key, value, positions, cos_sin_cache, key_cache, value_cache,
                                         slot_mapping, query_out, key_out, key_in_place, query_norm_weight,
                                         key_norm_weight, norm_eps, norm_weight_plus_one, kv_cache_dtype, k_scale,
                                         v_scale, error_flag, rotary_dim, style, q_scale, list(mrope_section),
                                         mrope_interleaved, key_cache_sf, value_cache_sf)]
    ct = m.compute_dtype(key.dtype)
    if mrope_section:  # positions [3, T]
        cos, sin, ok = m.mrope_tables_from_cache(cos_sin_cache, positions, mrope_section, mrope_interleaved, style, ct)
    else:
        cos, sin, ok = m.tables_from_cache(cos_sin_cache, positions, 1, style, ct)  # [1, T, R], [1, T]
    ok = ok[0]
    keep = ok[:, None, None]

    def rotated(x, weight):  # [T, heads, D] in x's dtype, rounded once
        y = x.to(ct)
        if weight is not None:
            y = m.rms_norm(y, weight.to(ct), norm_eps, norm_weight_plus_one)
        return m.rope(y.transpose(0, 1)[None], cos, sin, style)[0].transpose(0, 1).to(x.dtype)

    k_rot = rotated(key, key_norm_weight)
    if query is not None:
        q_rot = rotated(query, query_norm_weight)
        if query_out is not None and query_out.dtype == torch.float8_e4m3fn:  # written as bytes, as the caches
            target, q_rot = query_out.view(torch.uint8), _fp8_bytes(q_rot, q_scale, torch.float8_e4m3fn, ct)
        else:
            target = query if query_out is None else query_out
        target.copy_(torch.where(keep, q_rot, target))
    for out in (key_out, key if key_in_place else None):
        if out is not None:
            out.copy_(torch.where(keep, k_rot, out))
    paged = key_cache.dim() == 4
    page_size = key_cache.shape[1] if paged else 1
    num_slots = key_cache.shape[0] * page_size
    pages, offsets, tokens = _slot_writes(slot_mapping, ok, num_slots, page_size, error_flag)
    for cache, sf, rows, scale in ((key_cache, key_cache_sf, k_rot, k_scale), (value_cache, value_cache_sf, value,
                                                                              v_scale)):
        view = cache if paged else cache.unsqueeze(1)  # [pages, P, H, D]
        rows = rows[tokens]
        if fmt == "nvfp4":  # codes [.., D / 2] and block scales [.., D / 16], as bytes
            rows, scales = m.to_nvfp4(rows, scale)
            (sf if paged else sf.unsqueeze(1)).view(torch.uint8)[pages, offsets] = scales
        elif fmt is not None:  # written as bytes: uint8 caches, and no float8 indexing kernels needed
            view, rows = view.view(torch.uint8), _fp8_bytes(rows, scale, fmt, ct)
        view[pages, offsets] = rows


@torch.library.impl("kvrope::mla_append_", "cpu")
def _mla_append_cpu(query_pe, kv_c, k_pe, positions, cos_sin_cache, latent_cache, slot_mapping, rope_cache=None,
                    query_nope=None, query_out=None, kv_cache_dtype="auto", kv_scale=None, q_scale=None,
                    error_flag=None, style=1, enable_pdl=False):
    """The MLA append (docs/spec.md section 6.6). A token whose position is out of range writes nothing; a
    negative or out-of-range slot writes no cache row; the last token naming a slot wins. q_pe rotated in place,
    or into query_out's last R dims (q_nope copied into its first N when given; float8_e4m3fn: quantized with
    q_scale as rope_append_'s); the latent row [kv_c | RoPE(k_pe)] into latent_cache's row (vLLM's one cache), or
    kv_c into latent_cache's and RoPE(k_pe) into rope_cache's, quantized for fp8 caches (_fp8_bytes, kv_scale)."""
    fmt = _CACHE_FORMATS[_C.check_mla_append(query_pe, kv_c, k_pe, positions, cos_sin_cache, latent_cache,
                                             slot_mapping, rope_cache, query_nope, query_out, kv_cache_dtype,
                                             kv_scale, q_scale, error_flag, style)]
    ct = m.compute_dtype(kv_c.dtype)
    r = k_pe.shape[-1]
    cos, sin, ok = m.tables_from_cache(cos_sin_cache, positions, 1, style, ct)  # [1, T, R], [1, T]
    ok = ok[0]

    def rotated(x):  # [T, heads, R] in x's dtype, rounded once
        return m.rope(x.to(ct).transpose(0, 1)[None], cos, sin, style)[0].transpose(0, 1).to(x.dtype)

    if query_pe is not None:
        rows, target = rotated(query_pe), query_pe
        if query_out is not None:  # rows [N + R]: RoPE(q_pe) last, q_nope first where given
            target = query_out if query_nope is not None else query_out[..., query_out.shape[-1] - r:]
            rows = rows if query_nope is None else torch.cat((query_nope, rows), dim=-1)
            if query_out.dtype == torch.float8_e4m3fn:  # written as bytes, as the caches
                target, rows = target.view(torch.uint8), _fp8_bytes(rows, q_scale, torch.float8_e4m3fn, ct)
        target.copy_(torch.where(ok[:, None, None], rows, target))
    k_rot = rotated(k_pe[:, None])[:, 0]
    page_size = latent_cache.shape[1]
    num_slots = latent_cache.shape[0] * page_size
    pages, offsets, tokens = _slot_writes(slot_mapping, ok, num_slots, page_size, error_flag)
    parts = ((latent_cache, torch.cat((kv_c, k_rot), dim=-1)),) if rope_cache is None else (
        (latent_cache, kv_c), (rope_cache, k_rot))
    for cache, rows in parts:
        rows = rows[tokens]
        if fmt is not None:  # written as bytes: uint8 caches, and no float8 indexing kernels needed
            cache, rows = cache.view(torch.uint8), _fp8_bytes(rows, kv_scale, fmt, ct)
        cache[pages, offsets] = rows


# --- fake implementations: shapes for torch.compile and opcheck ------------------------------------
# The backward's outputs are contiguous whatever the inputs' strides, as the CPU and CUDA ops make them.

@torch.library.register_fake("kvrope::forward")
def _forward_fake(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, rotary_dim=0, style=0):
    _C.check_forward(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, rotary_dim, style)
    return torch.empty_like(key_cache), torch.empty_like(value_cache), torch.empty_like(key_states)


@torch.library.register_fake("kvrope::forward_")
def _forward_inplace_fake(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, cos_sin_cache,
                          position_ids, query, query_out, key_out, error_flag, rotary_dim=0, style=0):
    _C.check_forward_(key_states, value_states, key_cache, value_cache, cache_position, cos, sin, cos_sin_cache,
                      position_ids, query, query_out, key_out, error_flag, rotary_dim, style)
    return None


@torch.library.register_fake("kvrope::rope_append_")
def _append_fake(query, key, value, positions, cos_sin_cache, key_cache, value_cache, slot_mapping, query_out=None,
                 key_out=None, key_in_place=False, query_norm_weight=None, key_norm_weight=None, norm_eps=1e-6,
                 norm_weight_plus_one=False, kv_cache_dtype="auto", k_scale=None, v_scale=None, error_flag=None,
                 rotary_dim=0, style=0, q_scale=None, enable_pdl=False, mrope_section=(), mrope_interleaved=False,
                 key_cache_sf=None, value_cache_sf=None):
    _C.check_append(query, key, value, positions, cos_sin_cache, key_cache, value_cache, slot_mapping, query_out,
                    key_out, key_in_place, query_norm_weight, key_norm_weight, norm_eps, norm_weight_plus_one,
                    kv_cache_dtype, k_scale, v_scale, error_flag, rotary_dim, style, q_scale, list(mrope_section),
                    mrope_interleaved, key_cache_sf, value_cache_sf)
    return None


@torch.library.register_fake("kvrope::mla_append_")
def _mla_append_fake(query_pe, kv_c, k_pe, positions, cos_sin_cache, latent_cache, slot_mapping, rope_cache=None,
                     query_nope=None, query_out=None, kv_cache_dtype="auto", kv_scale=None, q_scale=None,
                     error_flag=None, style=1, enable_pdl=False):
    _C.check_mla_append(query_pe, kv_c, k_pe, positions, cos_sin_cache, latent_cache, slot_mapping, rope_cache,
                        query_nope, query_out, kv_cache_dtype, kv_scale, q_scale, error_flag, style)
    return None


def _backward_fake_parts(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim, style,
                         table_grads):
    _C.check_backward(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim, style,
                      table_grads)
    b, h, _, d = grad_key_cache.shape
    gk = grad_key_cache.new_empty((b, h, cache_position.shape[0], d))
    table = cos.shape if table_grads else (0,)
    tables = cos.new_empty(table), cos.new_empty(table)
    return gk, torch.empty_like(gk), *tables


@torch.library.register_fake("kvrope::backward")
def _backward_fake(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim=0, style=0,
                   table_grads=True):
    return (*_backward_fake_parts(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim,
                                  style, table_grads),
            grad_key_cache.new_empty(grad_key_cache.shape), grad_value_cache.new_empty(grad_value_cache.shape))


@torch.library.register_fake("kvrope::backward_")
def _backward_inplace_fake(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim=0,
                           style=0, table_grads=True):
    return _backward_fake_parts(grad_key_cache, grad_value_cache, key_states, cos, sin, cache_position, rotary_dim,
                                style, table_grads)


# --- autograd of the functional forward -------------------------------------------------------------

def _setup_context(ctx, inputs, output):
    key_states, _, key_cache, _, cache_position, cos, sin, rotary_dim, style = inputs
    ctx.save_for_backward(key_states, cos, sin, cache_position)
    ctx.rotary_dim, ctx.style, ctx.cache_shape = rotary_dim, style, key_cache.shape
    ctx.set_materialize_grads(False)


def _forward_backward(ctx, grad_key_cache, grad_value_cache, grad_key_out):
    key_states, cos, sin, cache_position = ctx.saved_tensors
    need = ctx.needs_input_grad
    table_grads = need[5] or need[6]

    def rows(g):  # an absent gradient is zeros; an expanded one (of a sum: stride 0) is made contiguous
        if g is None:
            return key_states.new_zeros(ctx.cache_shape)
        return g if g.stride(-1) == 1 else g.contiguous()

    gk, gv, gc, gs, gkc, gvc = ops.backward(rows(grad_key_cache), rows(grad_value_cache),
                                            key_states if table_grads else None, cos, sin, cache_position,
                                            ctx.rotary_dim, ctx.style, table_grads)
    if grad_key_out is not None:  # RoPE(k) returned and used: its gradient joins k's and the tables'
        ct = m.compute_dtype(key_states.dtype)
        extra_k, extra_c, extra_s = m.rope_backward(grad_key_out.to(ct), key_states.to(ct), cos.to(ct), sin.to(ct),
                                                    ctx.style, table_grads)
        gk = (gk.to(ct) + extra_k).to(gk.dtype)
        if table_grads:
            gc, gs = (gc.to(ct) + extra_c).to(gc.dtype), (gs.to(ct) + extra_s).to(gs.dtype)
    return (gk if need[0] else None, gv if need[1] else None, gkc if need[2] else None, gvc if need[3] else None,
            None, gc if need[5] else None, gs if need[6] else None, None, None)


torch.library.register_autograd("kvrope::forward", _forward_backward, setup_context=_setup_context)
