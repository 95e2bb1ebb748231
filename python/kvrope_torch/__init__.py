"""kvrope for PyTorch: the fused KV-cache update with RoPE (forward) and its backward as torch custom
ops (namespace ``kvrope``), with autograd, CPU implementations and torch.compile support.

Tensors are [B, H, L, D] head rows (k, v, q, the caches and their gradients); a BSHD tensor is
passed as its [B, H, S, D] view (``x.transpose(1, 2)``): only the last dim must be contiguous.
Per-token tables are [B, S, R] or [1, S, R] (shared by the batch); R <= D, the rest of a row passes
through. ``style`` is ``"rotate_half"`` (Llama, Hugging Face) or ``"interleaved"`` (GPT-J).
See python/README.md and docs/spec.md."""
from typing import Optional, Tuple

import torch
from torch.overrides import has_torch_function

from . import _C, _checks, _ops
from ._math import INTERLEAVED, ROTATE_HALF

__all__ = ["forward", "forward_", "backward", "backward_", "ERROR_POSITION_OUT_OF_RANGE",
           "ERROR_POSITION_ID_OUT_OF_RANGE"]

ERROR_POSITION_OUT_OF_RANGE = _ops.ERROR_POSITION_OUT_OF_RANGE
ERROR_POSITION_ID_OUT_OF_RANGE = _ops.ERROR_POSITION_ID_OUT_OF_RANGE
_STYLES = {"rotate_half": ROTATE_HALF, "interleaved": INTERLEAVED}
# The ops from C++ (_C: through the dispatcher, without torch.ops' argument parsing in Python, ~5 µs a
# call), or through torch.ops where Python must see the call: a __torch_function__ mode or subclass, and
# torch.compile's tracing. The ops check their arguments before any work, with one set of messages: the
# CUDA ones in C++ (csrc/checks.cpp), the CPU ones in Python (_checks.py). The API adds only what the
# schemas cannot say (a table given as None, the style's name).
_FORWARD, _FORWARD_INPLACE, _BACKWARD, _BACKWARD_INPLACE = (
    (getattr(_C, name), getattr(_ops.ops, name).default) for name in ("forward", "forward_", "backward", "backward_"))


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


def forward(key_states: torch.Tensor, value_states: torch.Tensor, key_cache: torch.Tensor,
            value_cache: torch.Tensor, cache_position: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
            style: str = "rotate_half") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The functional forward, with autograd: returns (new key cache, new value cache, RoPE(k)).

    Rows ``cache_position`` of the new caches hold RoPE(k) and v; every other row is the input's.
    Repeated positions: the last token naming a row wins; a position outside [-S_max, S_max) writes no
    row. Gradients flow to k, v, cos, sin and both incoming caches through ``kvrope::backward``
    (docs/spec.md section 1: with a repeated row every token receives that row's gradient)."""
    _checks.check_tables_given(cos, sin)
    return _call(_FORWARD, key_states, value_states, key_cache, value_cache, cache_position, cos, sin, 0,
                 _style(style))


def forward_(key_states: torch.Tensor, value_states: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, cache_position: torch.Tensor, cos: Optional[torch.Tensor] = None,
             sin: Optional[torch.Tensor] = None, *, cos_sin_cache: Optional[torch.Tensor] = None,
             position_ids: Optional[torch.Tensor] = None, query: Optional[torch.Tensor] = None,
             query_out: Optional[torch.Tensor] = None, key_out: Optional[torch.Tensor] = None,
             error_flag: Optional[torch.Tensor] = None, style: str = "rotate_half") -> None:
    """The inference forward, in place: RoPE(k) and v into rows ``cache_position`` of the caches; RoPE(k)
    into ``key_out`` and RoPE(q) into ``query_out`` (or ``query`` itself) when given. The tables come
    from cos / sin [B or 1, S, R], or from a table cache [max_pos, R] (cos | sin, one angle a pair; T or
    fp32) indexed by ``position_ids`` [S] or [B, S] (the dtype of ``cache_position``). ``error_flag``,
    an int32 tensor of one element, gets ERROR_POSITION_OUT_OF_RANGE / ERROR_POSITION_ID_OUT_OF_RANGE
    OR-ed in (read it after the stream; the call itself never synchronizes)."""
    _call(_FORWARD_INPLACE, key_states, value_states, key_cache, value_cache, cache_position, cos, sin,
          cos_sin_cache, position_ids, query, query_out, key_out, error_flag, 0, _style(style))


def backward(grad_key_cache: torch.Tensor, grad_value_cache: torch.Tensor, key_states: Optional[torch.Tensor],
             cos: torch.Tensor, sin: torch.Tensor, cache_position: torch.Tensor, *, style: str = "rotate_half",
             table_grads: bool = True) -> Tuple[torch.Tensor, ...]:
    """The backward, out of place: (grad k, grad v, grad cos, grad sin, grad of the incoming key cache,
    of the incoming value cache). grad cos / sin have the tables' shape (summed over the batch for
    [1, S, R] tables) and are empty when ``table_grads`` is False (then key_states may be None)."""
    _checks.check_tables_given(cos, sin)
    table_grads = bool(table_grads)
    return _call(_BACKWARD, grad_key_cache, grad_value_cache, key_states if table_grads else None, cos, sin,
                 cache_position, 0, _style(style), table_grads)


def backward_(grad_key_cache: torch.Tensor, grad_value_cache: torch.Tensor, key_states: Optional[torch.Tensor],
              cos: torch.Tensor, sin: torch.Tensor, cache_position: torch.Tensor, *, style: str = "rotate_half",
              table_grads: bool = True) -> Tuple[torch.Tensor, ...]:
    """The backward, in place: returns (grad k, grad v, grad cos, grad sin); grad_key_cache and
    grad_value_cache become the incoming caches' gradients (their rows cache_position zeroed)."""
    _checks.check_tables_given(cos, sin)
    table_grads = bool(table_grads)
    return _call(_BACKWARD_INPLACE, grad_key_cache, grad_value_cache, key_states if table_grads else None, cos, sin,
                 cache_position, 0, _style(style), table_grads)
