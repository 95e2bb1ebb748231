"""Hugging Face transformers (5.x): a Llama-family model's rotary embedding and static-cache update
through kvrope.

    import kvrope_torch.hf
    kvrope_torch.hf.use_kvrope(model)          # every LlamaAttention of the model, in place
    model.generate(ids, cache_implementation="static", max_new_tokens=32)

``use_kvrope`` replaces the forward of each attention module of the given classes (default: Llama's)
with one that computes the same thing: q, k, v projected as the stock module does, then

- with a static cache layer (``StaticLayer``: ``cache_implementation="static"``) and nothing that
  needs a gradient: one ``kvrope_torch.forward_`` call rotates q and k and writes RoPE(k) and v into
  the layer's rows ``cumulative_length + arange(S)``, as ``StaticLayer.update`` would, and the
  attention reads the layer's whole cache;
- otherwise (training, a dynamic cache, a sliding or offloaded one): q and k are rotated by
  ``kvrope_torch.forward`` (functional, with autograd: gradients reach q, k and the tables through
  ``kvrope::backward``), then the cache, if any, is updated by its own ``update``.

The attention itself, the mask and the output projection are the stock module's. ``restore(model)``
puts the stock forwards back. Needs transformers 5.x (tested with 5.17); imported on first use.
"""
import sys
import types
from typing import Iterable, Optional, Tuple

import torch

from . import forward, forward_

_STOCK = "_kvrope_stock_forward"


def _attention_classes():
    from transformers.models.llama.modeling_llama import LlamaAttention
    return (LlamaAttention,)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE(x) for x [B, heads, S, D] through the functional forward (autograd): x is its own value rows
    and a cache of S rows is written at arange(S), of which only the rotated rows are kept."""
    b, h, s, d = x.shape
    cache = x.new_zeros(b, h, s, d)
    rows = torch.arange(s, device=x.device)
    return forward(x, x, cache, cache, rows, cos, sin)[2]


def _static_layer(cache, layer_idx: int):
    """The cache's StaticLayer for this layer when kvrope can update it in place, else None."""
    if cache is None or getattr(cache, "offloading", False):
        return None
    from transformers.cache_utils import StaticLayer
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers) or type(layers[layer_idx]) is not StaticLayer:
        return None
    return layers[layer_idx]


def _forward(self, hidden_states: torch.Tensor, position_embeddings: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
             attention_mask: Optional[torch.Tensor] = None, cache=None, **kwargs):
    cache = kwargs.pop("past_key_values", cache)
    modeling = sys.modules[type(self).__module__]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings

    layer = _static_layer(cache, self.layer_idx)
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (query_states, key_states, value_states, cos, sin))
    if layer is not None and not needs_grad:
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        s = key_states.shape[-2]
        rows = torch.arange(s, device=key_states.device) + layer.cumulative_length
        layer.cumulative_length.add_(s)
        query_out = torch.empty_like(query_states)
        forward_(key_states, value_states, layer.keys, layer.values, rows, cos, sin, query=query_states,
                 query_out=query_out)
        query_states, key_states, value_states = query_out, layer.keys, layer.values
    else:
        query_states, key_states = _rotate(query_states, cos, sin), _rotate(key_states, cos, sin)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)

    attention_interface = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                         modeling.eager_attention_forward)
    attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states, attention_mask,
                                                    dropout=0.0 if not self.training else self.attention_dropout,
                                                    scaling=self.scaling, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), attn_weights


def use_kvrope(model: torch.nn.Module, classes: Optional[Iterable[type]] = None) -> int:
    """Routes the rotary embedding and cache update of every attention module of ``classes`` (default:
    transformers' LlamaAttention) in ``model`` through kvrope. Returns how many modules it changed; a
    ValueError when there is none (another architecture: pass its attention class if its forward is
    Llama's)."""
    classes = tuple(classes) if classes is not None else _attention_classes()
    changed = 0
    for module in model.modules():
        if isinstance(module, classes) and not hasattr(module, _STOCK):
            setattr(module, _STOCK, module.forward)
            module.forward = types.MethodType(_forward, module)
            changed += 1
    if changed == 0 and not any(isinstance(m, classes) and hasattr(m, _STOCK) for m in model.modules()):
        names = ", ".join(c.__name__ for c in classes)
        raise ValueError(f"kvrope: the model has no attention module of {names}")
    return changed


def restore(model: torch.nn.Module) -> int:
    """Puts back the stock forward of every module use_kvrope changed; returns how many."""
    restored = 0
    for module in model.modules():
        if hasattr(module, _STOCK):
            module.forward = getattr(module, _STOCK)
            delattr(module, _STOCK)
            restored += 1
    return restored
