"""kvrope for PyTorch: the fused KV-cache update with RoPE (forward) and its backward as torch custom
ops (namespace ``kvrope``), with autograd, CPU implementations and torch.compile support.

Tensors are [B, H, L, D] head rows (k, v, q, the caches and their gradients); a BSHD tensor is
passed as its [B, H, S, D] view (``x.transpose(1, 2)``): only the last dim must be contiguous.
Per-token tables are [B, S, R] or [1, S, R] (shared by the batch); R <= D, the rest of a row passes
through. ``style`` is ``"rotate_half"`` (Llama, Hugging Face) or ``"interleaved"`` (GPT-J).
The serving forward (``rope_append_``, and ``rotary_embedding_and_cache`` with vLLM's calling convention)
takes ragged tokens [T, heads, D] and a paged, flat, fp8 or NVFP4 KV cache; ``mla_append_`` is its MLA variant
(DeepSeek-V2/V3: q_pe rotated, [kv_c | RoPE(k_pe)] into a latent cache). See python/README.md and docs/spec.md."""
import operator
from typing import Optional, Sequence, Tuple

import torch
from torch.overrides import has_torch_function

from . import _C, _ops
from ._math import INTERLEAVED, ROTATE_HALF

__all__ = ["forward", "forward_", "backward", "backward_", "rope_append_", "rotary_embedding_and_cache",
           "mla_append_", "ERROR_POSITION_OUT_OF_RANGE", "ERROR_POSITION_ID_OUT_OF_RANGE", "ERROR_SLOT_OUT_OF_RANGE"]

ERROR_POSITION_OUT_OF_RANGE = _ops.ERROR_POSITION_OUT_OF_RANGE
ERROR_POSITION_ID_OUT_OF_RANGE = _ops.ERROR_POSITION_ID_OUT_OF_RANGE
ERROR_SLOT_OUT_OF_RANGE = _ops.ERROR_SLOT_OUT_OF_RANGE
_STYLES = {"rotate_half": ROTATE_HALF, "interleaved": INTERLEAVED}
# The ops from C++ (_C: through the dispatcher, without torch.ops' argument parsing in Python, ~5 µs a
# call), or through torch.ops where Python must see the call: a __torch_function__ mode or subclass, and
# torch.compile's tracing. The ops check their arguments before any work, all with one copy of the checks
# (csrc/checks.cpp; the CPU and fake ops call it as _C.check_*). The API adds only what its own arguments
# need (the style's name, the tables' layout, a cache's layout, vLLM's shapes, reading the error flag).
_FORWARD, _FORWARD_INPLACE, _BACKWARD, _BACKWARD_INPLACE, _APPEND, _MLA_APPEND = (
    (getattr(_C, name), getattr(_ops.ops, name).default)
    for name in ("forward", "forward_", "backward", "backward_", "rope_append_", "mla_append_"))


def _call(op, *args):
    from_cpp, overload = op
    if torch.compiler.is_compiling() or has_torch_function(args):
        return overload(*args)
    return from_cpp(*args)


def _style(style: str) -> int:
    code = _STYLES.get(style)
    if code is None:
        raise ValueError(f"kvrope: style must be 'rotate_half' or 'interleaved', not {style!r}")
    return code


_TABLE_LAYOUTS = ("element", "half")
# The caches that take k_scale and v_scale: vLLM passes them always, and other caches ignore them.
_FP8_CACHE_DTYPES = (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2)


def _tables(cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], style: str, table_layout: str):
    """The per-token tables in kvrope's layout, one value an element. ``"half"``: Hugging Face's tables
    for every model, cat(freqs, freqs) (pair i's angle in columns i and i + R/2); for the rotate-half
    style that is already one value an element, for the interleaved style column i becomes columns 2i and
    2i + 1 (as GLM converts them; autograd carries the gradients back to the given tables)."""
    if table_layout not in _TABLE_LAYOUTS:
        raise ValueError(f"kvrope: table_layout must be 'element' or 'half', not {table_layout!r}")
    if table_layout == "element" or style != "interleaved" or cos is None or sin is None:
        return cos, sin
    if cos.shape[-1] % 2 or sin.shape[-1] % 2:
        raise ValueError(f"kvrope: table_layout='half' needs an even R, not cos {list(cos.shape)}, "
                         f"sin {list(sin.shape)}")
    return (cos[..., :cos.shape[-1] // 2].repeat_interleave(2, dim=-1),
            sin[..., :sin.shape[-1] // 2].repeat_interleave(2, dim=-1))


@torch.compiler.disable  # reads device values: eager, a graph break under torch.compile
def _check_pairs(cos: torch.Tensor, sin: torch.Tensor, style: str) -> None:
    """check=True, interleaved style: tables in Hugging Face's layout (columns i and i + R/2 equal) whose
    pairs (2i, 2i + 1) differ are refused with a ValueError (synchronizes); any other table is taken as
    one value an element."""
    if style != "interleaved" or cos is None or sin is None:  # (the op names a missing table)
        return
    _refuse_capture("the tables", cos)
    r = cos.shape[-1]
    for name, t in (("cos", cos), ("sin", sin)):
        if torch.equal(t[..., :r // 2], t[..., r // 2:]) and not torch.equal(t[..., 0::2], t[..., 1::2]):
            raise ValueError(f"kvrope: {name} is in Hugging Face's layout (cat(freqs, freqs): columns i and "
                             "i + R/2 equal), not one angle a pair (2i, 2i + 1) of the interleaved style: pass "
                             "table_layout='half'")


def _refuse_grad(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """An in-place op writes outside autograd: an input that requires grad in grad mode would lose its
    gradient without a word, so it is refused."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(f"kvrope: {op} writes in place outside autograd, and {name} requires grad: its "
                               "gradient would be lost. Use kvrope_torch.forward (functional, with autograd) to "
                               f"train, or call {op} under torch.no_grad() or torch.inference_mode()")


def _refuse_capture(what: str, t: torch.Tensor, hint: str = "") -> None:
    """check=True reads device values (a synchronization): refused while a CUDA graph is captured."""
    if t.is_cuda and not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing():
        raise ValueError(f"kvrope: check=True reads {what} (it synchronizes): not under CUDA graph capture{hint}")


@torch.compiler.disable  # reads device values: eager, a graph break under torch.compile
def _check_positions(name: str, positions: torch.Tensor, cache_len: int) -> None:
    """check=True: every position in [-S_max, S_max), else a ValueError (reads the positions: synchronizes)."""
    _refuse_capture("the positions", positions)
    bad = (positions < -cache_len) | (positions >= cache_len)
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        raise ValueError(f"kvrope: {name}[{index}] = {int(positions[index])} is outside [-S_max, S_max) = "
                         f"[{-cache_len}, {cache_len}): that token's row would be dropped")


def forward(key_states: torch.Tensor, value_states: torch.Tensor, key_cache: torch.Tensor,
            value_cache: torch.Tensor, cache_position: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
            style: str = "rotate_half", table_layout: str = "element",
            check: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The functional forward, with autograd: returns (new key cache, new value cache, RoPE(k)).

    Rows ``cache_position`` of the new caches hold RoPE(k) and v; every other row is the input's.
    Repeated positions: the last token naming a row wins; a position outside [-S_max, S_max) writes no
    row. Gradients flow to k, v, cos, sin and both incoming caches through ``kvrope::backward``
    (docs/spec.md section 1: with a repeated row every token receives that row's gradient).
    ``table_layout``: ``"element"`` (one value an element, kvrope's) or ``"half"`` (Hugging Face's cos and
    sin as every model computes them, cat(freqs, freqs): with ``style="interleaved"`` they are spread to
    the pairs (2i, 2i + 1)). ``check``: raise a ValueError instead for a position out of range, or, with
    the interleaved style, for tables in Hugging Face's layout given as elements (reads them: synchronizes)."""
    cos, sin = _tables(cos, sin, style, table_layout)
    if check:
        _check_positions("cache_position", cache_position, key_cache.shape[2])
        _check_pairs(cos, sin, style)
    return _call(_FORWARD, key_states, value_states, key_cache, value_cache, cache_position, cos, sin, 0,
                 _style(style))


def forward_(key_states: torch.Tensor, value_states: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, cache_position: torch.Tensor, cos: Optional[torch.Tensor] = None,
             sin: Optional[torch.Tensor] = None, *, cos_sin_cache: Optional[torch.Tensor] = None,
             position_ids: Optional[torch.Tensor] = None, query: Optional[torch.Tensor] = None,
             query_out: Optional[torch.Tensor] = None, key_out: Optional[torch.Tensor] = None,
             error_flag: Optional[torch.Tensor] = None, style: str = "rotate_half",
             table_layout: str = "element") -> None:
    """The inference forward, in place: RoPE(k) and v into rows ``cache_position`` of the caches; RoPE(k)
    into ``key_out`` and RoPE(q) into ``query_out`` (or ``query`` itself) when given. The tables come
    from cos / sin [B or 1, S, R], or from a table cache [max_pos, R] (cos | sin, one angle a pair; T or
    fp32) indexed by ``position_ids`` [S] or [B, S] (the dtype of ``cache_position``). ``error_flag``,
    an int32 tensor of one element, gets ERROR_POSITION_OUT_OF_RANGE / ERROR_POSITION_ID_OUT_OF_RANGE
    OR-ed in (read it after the stream; the call itself never synchronizes). ``table_layout`` as in
    ``forward`` (cos / sin only). No autograd: in grad mode an input that requires grad is refused (use
    ``forward`` to train)."""
    _refuse_grad("forward_", key_states=key_states, value_states=value_states, key_cache=key_cache,
                 value_cache=value_cache, cos=cos, sin=sin, cos_sin_cache=cos_sin_cache, query=query)
    cos, sin = _tables(cos, sin, style, table_layout)
    _call(_FORWARD_INPLACE, key_states, value_states, key_cache, value_cache, cache_position, cos, sin,
          cos_sin_cache, position_ids, query, query_out, key_out, error_flag, 0, _style(style))


def backward(grad_key_cache: torch.Tensor, grad_value_cache: torch.Tensor, key_states: Optional[torch.Tensor],
             cos: torch.Tensor, sin: torch.Tensor, cache_position: torch.Tensor, *, style: str = "rotate_half",
             table_grads: bool = True, check: bool = False) -> Tuple[torch.Tensor, ...]:
    """The backward, out of place: (grad k, grad v, grad cos, grad sin, grad of the incoming key cache,
    of the incoming value cache). grad cos / sin have the tables' shape (summed over the batch for
    [1, S, R] tables) and are empty when ``table_grads`` is False (then key_states may be None). A
    position outside [-S_max, S_max) gets zero gradients; ``check``: a ValueError instead (synchronizes)."""
    if check:
        _check_positions("cache_position", cache_position, grad_key_cache.shape[2])
    table_grads = bool(table_grads)
    return _call(_BACKWARD, grad_key_cache, grad_value_cache, key_states if table_grads else None, cos, sin,
                 cache_position, 0, _style(style), table_grads)


def backward_(grad_key_cache: torch.Tensor, grad_value_cache: torch.Tensor, key_states: Optional[torch.Tensor],
              cos: torch.Tensor, sin: torch.Tensor, cache_position: torch.Tensor, *, style: str = "rotate_half",
              table_grads: bool = True) -> Tuple[torch.Tensor, ...]:
    """The backward, in place: returns (grad k, grad v, grad cos, grad sin); grad_key_cache and
    grad_value_cache become the incoming caches' gradients (their rows cache_position zeroed)."""
    _refuse_grad("backward_", grad_key_cache=grad_key_cache, grad_value_cache=grad_value_cache)
    table_grads = bool(table_grads)
    return _call(_BACKWARD_INPLACE, grad_key_cache, grad_value_cache, key_states if table_grads else None, cos, sin,
                 cache_position, 0, _style(style), table_grads)


def rope_append_(query: Optional[torch.Tensor], key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, *, query_out: Optional[torch.Tensor] = None,
                 key_out: Optional[torch.Tensor] = None, key_in_place: bool = False,
                 query_norm_weight: Optional[torch.Tensor] = None, key_norm_weight: Optional[torch.Tensor] = None,
                 norm_eps: float = 1e-6, norm_weight_plus_one: bool = False, kv_cache_dtype: str = "auto",
                 k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None,
                 key_cache_sf: Optional[torch.Tensor] = None, value_cache_sf: Optional[torch.Tensor] = None,
                 q_scale: Optional[torch.Tensor] = None, layout: str = "NHD",
                 error_flag: Optional[torch.Tensor] = None, check: bool = False, style: str = "rotate_half",
                 enable_pdl: bool = False, mrope_section: Optional[Sequence[int]] = None,
                 mrope_interleaved: bool = False) -> None:
    """The serving forward, in place, in one launch (docs/spec.md section 6).

    q [T, Hq, D] (or None) and k [T, H, D], optionally RMS-normed per head (``*_norm_weight`` [D];
    ``norm_weight_plus_one``: Gemma's 1 + w), are rotated with the table cache [max_pos, R] (cos | sin,
    in q's dtype or fp32) at ``positions`` [T] (int32 / int64); q in place or into ``query_out``, k into
    ``key_out`` or, with ``key_in_place``, into k itself. A ``query_out`` in torch.float8_e4m3fn gets what
    fp8 attention reads: RoPE(q) (its pass-through dims too) rounded to q's dtype, then
    fp8_satfinite(x / q_scale), ``q_scale`` float32 of one element (None: 1; only with an fp8 query_out).
    RoPE(k) and v [T, H, D] go to the cache rows of ``slot_mapping`` [T] (int64; slot s is page s // P,
    offset s % P; negative: no row; repeated: the last token wins). q, k, v may be views of one fused qkv
    tensor (any token and head strides, last dim contiguous).

    Caches: ``layout="NHD"`` [pages, P, H, D], ``"HND"`` [pages, H, P, D], or flat [slots, H, D]; any
    strides with the last dim contiguous. Their dtype is q's, or fp8: torch.float8_e4m3fn /
    torch.float8_e5m2, or uint8 with ``kv_cache_dtype`` "fp8" / "fp8_e4m3" / "fp8_e5m2"; stored =
    fp8_satfinite(x / scale) with ``k_scale`` / ``v_scale`` float32, one element or [H] (None: 1).
    ``kv_cache_dtype="nvfp4"``: FlashInfer's NVFP4 cache, uint8 caches [.., D / 2] (two e2m1 codes a byte,
    the even element low) and ``key_cache_sf`` / ``value_cache_sf`` float8_e4m3fn [.., D / 16] (a scale a
    block of 16, same layout), ``k_scale`` / ``v_scale`` the global decode scales; D and R multiples of 32,
    rows 16-byte aligned (docs/spec.md section 6.4).

    A slot at or above pages * P writes no row and ORs ERROR_SLOT_OUT_OF_RANGE into ``error_flag`` (an
    int32 tensor of one element); a position outside [0, max_pos) writes nothing at all and ORs
    ERROR_POSITION_ID_OUT_OF_RANGE. ``check=True`` reads the flag after the call and raises ValueError:
    that synchronizes, so it is refused under CUDA graph capture and is a graph break under torch.compile
    (a given ``error_flag`` keeps the bits of earlier calls). Otherwise the call never synchronizes and
    allocates nothing. No autograd: in grad mode an input that requires grad is refused. ``enable_pdl``
    (CUDA, sm_90+): a programmatic dependent launch, which may start while the kernel before it in the
    stream (the QKV projection) finishes and waits for its writes before reading (kvrope's
    AppendParams::enable_pdl).

    Multimodal positions (mRoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL; vLLM's MRotaryEmbedding): with
    ``mrope_section=[s0, s1, s2]`` (summing to R/2) ``positions`` is [3, T], the temporal, height and width
    streams (any stride between them), and pair i takes its angle from the row of the position of its
    stream: contiguous sections, stream 0 for i < s0, 1 for i < s0 + s1, else 2; with ``mrope_interleaved``
    (Qwen3-VL), stream 1 where i % 3 == 1 and i < 3 s1, 2 where i % 3 == 2 and i < 3 s2, else 0. A token
    with any of its three positions out of range writes nothing."""
    _refuse_grad("rope_append_", query=query, key=key, value=value, cos_sin_cache=cos_sin_cache,
                 key_cache=key_cache, value_cache=value_cache, query_norm_weight=query_norm_weight,
                 key_norm_weight=key_norm_weight)
    if layout == "HND":
        if key_cache.dim() != 4 or value_cache.dim() != 4:
            raise ValueError("kvrope: layout 'HND' needs caches [pages, H, P, D]")
        key_cache, value_cache = key_cache.transpose(1, 2), value_cache.transpose(1, 2)
        key_cache_sf, value_cache_sf = (None if sf is None else sf.transpose(1, 2) if sf.dim() == 4 else sf
                                        for sf in (key_cache_sf, value_cache_sf))
    elif layout != "NHD":
        raise ValueError(f"kvrope: layout must be 'NHD' or 'HND', not {layout!r}")
    if check:
        _refuse_capture("the error flag", key, "; pass error_flag and read it after the replay")
        if error_flag is None:
            error_flag = torch.zeros(1, dtype=torch.int32, device=key.device)
    _call(_APPEND, query, key, value, positions, cos_sin_cache, key_cache, value_cache, slot_mapping, query_out,
          key_out, bool(key_in_place), query_norm_weight, key_norm_weight, float(norm_eps),
          bool(norm_weight_plus_one), kv_cache_dtype, k_scale, v_scale, error_flag, 0, _style(style), q_scale,
          bool(enable_pdl), _mrope_section(mrope_section), bool(mrope_interleaved), key_cache_sf, value_cache_sf)
    if check:
        slots = key_cache.shape[0] * (key_cache.shape[1] if key_cache.dim() == 4 else 1)
        _raise_on_flag(error_flag, cos_sin_cache.shape[0], slots)


def _mrope_section(section: Optional[Sequence[int]]) -> list:
    """mrope_section as the op takes it: a list of ints, empty for None (no mRoPE)."""
    if section is None:
        return []
    try:
        return [operator.index(s) for s in section]
    except TypeError:
        raise TypeError(f"kvrope: mrope_section must be a sequence of ints, not {section!r}") from None


@torch.compiler.disable  # reads a device value: eager, a graph break under torch.compile (refused with fullgraph)
def _raise_on_flag(error_flag: torch.Tensor, max_position: int, slots: int) -> None:
    flag = int(error_flag.item())
    if flag & ERROR_POSITION_ID_OUT_OF_RANGE:
        raise ValueError(f"kvrope: positions holds a position outside [0, max_position={max_position}): "
                         "its tokens wrote nothing")
    if flag & ERROR_SLOT_OUT_OF_RANGE:
        raise ValueError(f"kvrope: slot_mapping holds a slot at or above num_pages * page_size = {slots}: "
                         "its tokens wrote no cache row")


def _token_heads(name: str, x: torch.Tensor, tokens: int, head_size: int) -> torch.Tensor:
    """x [..., heads * head_size] or [..., heads, head_size] over `tokens` tokens as a [T, heads, D] view."""
    if x.numel() % max(tokens * head_size, 1) or x.shape[-1] % head_size:
        raise ValueError(f"kvrope: {name} of shape {list(x.shape)} is not [T={tokens}, heads * {head_size}] "
                         f"or [T, heads, {head_size}]")
    if x.dim() == 3 and x.shape[0] == tokens and x.shape[2] == head_size:
        return x
    try:
        return x.view(tokens, -1, head_size)
    except RuntimeError as e:
        raise ValueError(f"kvrope: {name} of shape {list(x.shape)} and strides {list(x.stride())} has no "
                         f"[T, heads, {head_size}] view") from e


def rotary_embedding_and_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                               slot_mapping: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                               kv_cache_dtype: str = "auto", k_scale: Optional[torch.Tensor] = None,
                               v_scale: Optional[torch.Tensor] = None, head_size: Optional[int] = None, *,
                               error_flag: Optional[torch.Tensor] = None, query_out: Optional[torch.Tensor] = None,
                               q_scale: Optional[torch.Tensor] = None, enable_pdl: bool = False,
                               mrope_section: Optional[Sequence[int]] = None, mrope_interleaved: bool = False) -> None:
    """vLLM's ``rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`` followed by
    ``reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
    v_scale)``, in one launch: query and key rotated in place, RoPE(k) and v written to the caches.

    positions [T] (or any shape of T tokens); query [T, Hq * D] or [T, Hq, D], key [T, H * D] or
    [T, H, D], value [T, H, D] or [T, H * D], views of a fused qkv allowed; key_cache / value_cache
    vLLM's flash layout [num_blocks, block_size, H, D] (any strides, last dim contiguous: an HND cache
    as its transpose(1, 2)); cos_sin_cache [max_position, rot_dim]; head_size defaults to the caches'
    D. k_scale / v_scale are used only by fp8 caches ("fp8", "fp8_e4m3", "fp8_e5m2"; uint8 or float8
    tensors) and ignored otherwise, as vLLM passes them always. As in vLLM V1, slot_mapping may be
    shorter than T (tokens padded for a CUDA graph): the tokens past it are left as they are (neither
    rotated nor cached), where vLLM rotates them; their outputs are padding.

    Beyond vLLM's two calls: ``query_out`` (shaped as query) gets RoPE(q) instead of query itself, in
    query's dtype or in torch.float8_e4m3fn for fp8 attention (fp8_satfinite(x / q_scale), ``q_scale``
    float32 of one element, None: 1; as ``rope_append_``). Unlike k_scale, a q_scale without an fp8
    query_out is refused: no vLLM call passes it. ``enable_pdl``: as ``rope_append_``'s.

    mRoPE (vLLM's MRotaryEmbedding): with ``mrope_section`` (and ``mrope_interleaved``, as ``rope_append_``
    takes them) positions is [3, T], one stream of T tokens a row; slot_mapping shorter than T keeps the
    first tokens of each stream."""
    if kv_cache_dtype == "nvfp4":
        raise ValueError("kvrope: rotary_embedding_and_cache writes no NVFP4 cache (kv_cache_dtype 'nvfp4'): call "
                         "rope_append_ with key_cache_sf and value_cache_sf")
    d = int(head_size) if head_size is not None else key_cache.shape[-1]
    if d != key_cache.shape[-1]:  # (else a later check, of the tables or of q, would be blamed)
        raise ValueError(f"kvrope: head_size {d} differs from the caches' D = {key_cache.shape[-1]}")
    sections = _mrope_section(mrope_section)
    given_shape = list(positions.shape)
    positions = positions if sections else positions.flatten()  # mRoPE: [3, T] as given (the op checks it)
    slots = slot_mapping.flatten()
    tokens, n = positions.shape[-1], slots.shape[0]
    # positions the odd one out (q and k agree on T): name it, not query
    if query.dim() >= 2 and key.dim() >= 2 and query.shape[0] == key.shape[0] != tokens:
        hint = ("; positions [3, T] are mRoPE's three streams: pass mrope_section"
                if not sections and len(given_shape) == 2 and given_shape[0] == 3 else "")
        raise ValueError(f"kvrope: positions of shape {given_shape} gives {tokens} tokens, query "
                         f"{query.shape[0]}{hint}")
    q = _token_heads("query", query, tokens, d)
    k = _token_heads("key", key, tokens, d)
    v = _token_heads("value", value, tokens, d)
    q_out = None if query_out is None else _token_heads("query_out", query_out, tokens, d)
    if n > tokens:
        raise ValueError(f"kvrope: slot_mapping has {n} tokens, positions {tokens}")
    if n < tokens:
        q, k, v, positions = q[:n], k[:n], v[:n], positions[..., :n]
        q_out = None if q_out is None else q_out[:n]
    if key_cache.dtype not in _FP8_CACHE_DTYPES:  # (the op checks the caches' dtype and kv_cache_dtype)
        k_scale = v_scale = None
    _call(_APPEND, q, k, v, positions, cos_sin_cache, key_cache, value_cache, slots, q_out, None, True, None, None,
          1e-6, False, kv_cache_dtype, k_scale, v_scale, error_flag, 0, ROTATE_HALF if is_neox else INTERLEAVED,
          q_scale, bool(enable_pdl), sections, bool(mrope_interleaved), None, None)


def mla_append_(query_pe: Optional[torch.Tensor], kv_c: torch.Tensor, k_pe: torch.Tensor, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, latent_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                rope_cache: Optional[torch.Tensor] = None, query_nope: Optional[torch.Tensor] = None,
                query_out: Optional[torch.Tensor] = None, kv_cache_dtype: str = "auto",
                kv_scale: Optional[torch.Tensor] = None, q_scale: Optional[torch.Tensor] = None,
                error_flag: Optional[torch.Tensor] = None, check: bool = False, style: str = "interleaved",
                enable_pdl: bool = False) -> None:
    """The MLA latent-cache append (DeepSeek-V2/V3, Kimi K2; docs/spec.md section 6.6), in place, in one launch:
    kvrope's ``mla_append``, whose ``MlaAppendParams`` (include/kvrope/mla_append_params.cuh) documents each
    field. The arguments are its fields by name, but: a float8_e4m3fn ``query_out`` is ``query_out_fp8`` and
    ``q_scale`` its ``query_scale``; ``query_nope`` given sets ``write_query_nope``; an fp32 ``cos_sin_cache``
    is ``cos_sin_cache_f32``; the caches' dtype (and ``kv_cache_dtype``) is C; ``latent_cache`` and
    ``rope_cache`` are ``MlaCacheRows`` of the tensors' strides (without ``rope_cache``: ``mla_concat_latent``
    and ``mla_concat_rope`` of ``latent_cache``); T, Hq, N, R, L, pages, P and max_position are the shapes'.

    ``query_pe`` [T, Hq, R] (q's rotary part, or None) is rotated with the table cache ``cos_sin_cache``
    [max_pos, R] (cos | sin, one angle a pair; kv_c's dtype or fp32) at ``positions`` [T] (int32 / int64): in
    place, or into the last R dims of ``query_out`` [T, Hq, N + R], in kv_c's dtype or torch.float8_e4m3fn
    (fp8_satfinite(x / q_scale) of the value rounded to kv_c's dtype; ``q_scale`` float32 of one element, None:
    1; only with an fp8 query_out), query_pe then left as it was. ``query_nope`` [T, Hq, N], given with
    ``query_out``, is copied (quantized alike) into its first N dims; without it they are left as they are. A
    fused q [T, Hq, N + R] is query_nope = q[..., :N], query_pe = q[..., N:].

    Per token t, the latent row [kv_c[t] | RoPE(k_pe[t])] (``kv_c`` [T, L], normed, not rotated; ``k_pe`` [T, R])
    goes to slot ``slot_mapping[t]`` (int64; page s // P, offset s % P; negative: no row; repeated: the last
    token wins) of ``latent_cache`` [pages, P, L + R] (vLLM's concat_and_cache_mla layout) or, with
    ``rope_cache``, kv_c to ``latent_cache`` [pages, P, L] and RoPE(k_pe) to ``rope_cache`` [pages, P, R]
    (FlashInfer's ckv and kpe). Any page and offset strides, the last dim contiguous; kv_c, k_pe and q may be
    views of one projection. Caches in kv_c's dtype or fp8: torch.float8_e4m3fn / torch.float8_e5m2, or uint8
    with ``kv_cache_dtype`` "fp8" / "fp8_e4m3" / "fp8_e5m2"; stored = fp8_satfinite(x / kv_scale) of the value
    rounded to kv_c's dtype, ``kv_scale`` float32 of one element for both parts (None: 1; fp8 caches only).

    ``style``: "interleaved" (pairs (2i, 2i + 1): DeepSeek's checkpoints, the default) or "rotate_half". Bad data
    as ``rope_append_``'s: a slot at or above pages * P writes no row (q is still written) and ORs
    ERROR_SLOT_OUT_OF_RANGE into ``error_flag`` (int32, one element); a position outside [0, max_pos) writes
    nothing at all and ORs ERROR_POSITION_ID_OUT_OF_RANGE; ``check=True`` reads the flag after the call and
    raises ValueError (a synchronization: refused under CUDA graph capture, a graph break under torch.compile).
    Otherwise the call never synchronizes and allocates nothing. No autograd: in grad mode an input that
    requires grad is refused. ``enable_pdl``: as ``rope_append_``'s (CUDA, sm_90+)."""
    _refuse_grad("mla_append_", query_pe=query_pe, kv_c=kv_c, k_pe=k_pe, cos_sin_cache=cos_sin_cache,
                 latent_cache=latent_cache, rope_cache=rope_cache, query_nope=query_nope)
    if check:
        _refuse_capture("the error flag", kv_c, "; pass error_flag and read it after the replay")
        if error_flag is None:
            error_flag = torch.zeros(1, dtype=torch.int32, device=kv_c.device)
    _call(_MLA_APPEND, query_pe, kv_c, k_pe, positions, cos_sin_cache, latent_cache, slot_mapping, rope_cache,
          query_nope, query_out, kv_cache_dtype, kv_scale, q_scale, error_flag, _style(style), bool(enable_pdl))
    if check:
        _raise_on_flag(error_flag, cos_sin_cache.shape[0], latent_cache.shape[0] * latent_cache.shape[1])
