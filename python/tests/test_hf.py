"""kvrope_torch.hf: a transformers Llama with its rotary embedding and static-cache update through kvrope,
against the stock model (issue 36, item 6). CPU, fp32: it runs in CI."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import kvrope_torch  # noqa: E402
import kvrope_torch.hf  # noqa: E402

VOCAB = 96


def _model(seed):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config)


def _ids(seed, batch=2, length=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


@pytest.fixture
def fused_calls(monkeypatch):
    """How many times the fused static-cache path (kvrope_torch.forward_) ran."""
    calls = []
    fused = kvrope_torch.hf.forward_

    def counting(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(kvrope_torch.hf, "forward_", counting)
    return calls


def test_generate_with_a_static_cache_gives_the_stock_tokens(fused_calls):
    stock, ours = _model(0).eval(), _model(0).eval()
    assert kvrope_torch.hf.use_kvrope(ours) == 2
    ids = _ids(1)
    kw = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
    want = stock.generate(ids, **kw)
    got = ours.generate(ids, **kw)
    assert torch.equal(got, want)
    assert len(fused_calls) == 2 * 8  # every layer, the prefill and each new token but the last
    # The same through the logits of a prefill and one step.
    for model in (stock, ours):
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            first = model(ids, past_key_values=cache, use_cache=True).logits
            step = model(want[:, 5:6], past_key_values=cache, use_cache=True).logits
        model.result = (first, step)
    for g, w in zip(ours.result, stock.result):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_generate_with_a_dynamic_cache_gives_the_stock_tokens(fused_calls):
    stock, ours = _model(2).eval(), _model(2).eval()
    kvrope_torch.hf.use_kvrope(ours)
    ids = _ids(3)
    want = stock.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(ours.generate(ids, max_new_tokens=6, do_sample=False), want)
    assert not fused_calls  # the rotation through kvrope, the cache through its own update


def test_training_gives_the_stock_loss_and_gradients():
    stock, ours = _model(4).train(), _model(4).train()
    kvrope_torch.hf.use_kvrope(ours)
    ids = _ids(5, batch=3, length=12)
    losses = []
    for model in (stock, ours):
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(stock.named_parameters(), ours.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_restore_puts_the_stock_forward_back():
    model = _model(6)
    assert kvrope_torch.hf.use_kvrope(model) == 2
    assert kvrope_torch.hf.use_kvrope(model) == 0  # already routed: nothing more to change
    assert kvrope_torch.hf.restore(model) == 2
    with pytest.raises(ValueError, match="no attention module"):
        kvrope_torch.hf.use_kvrope(torch.nn.Linear(2, 2))


_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,seq", [(1, 1), (2, 1), (3, 1), (16, 1), (3, 7), (16, 5)])
def test_phi3_fused_qkv_views_in_place_give_the_stock_rotation_and_cache(device, dtype, batch, seq):
    """forward_ on the views Phi-3's own attention makes of its qkv_proj output (q rotated in place
    inside the fused projection, GQA, partial rotary 0.5), against the stock apply_rotary_pos_emb and a
    static cache's index_copy_ (issue 45: refused at batch > 1 before)."""
    from transformers.models.phi3 import modeling_phi3
    torch.manual_seed(batch * 100 + seq)
    config = transformers.Phi3Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=8, num_key_value_heads=2, partial_rotary_factor=0.5,
                                     max_position_embeddings=64, pad_token_id=0)
    model = transformers.Phi3ForCausalLM(config).to(device=device, dtype=dtype).eval()
    attn = model.model.layers[0].self_attn
    hidden = torch.randn(batch, seq, config.hidden_size, device=device, dtype=dtype)
    start = 9
    position_ids = (start + torch.arange(seq, device=device)).expand(batch, seq)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(hidden, position_ids)
        # Phi3Attention.forward's views, as transformers 5.17 writes them.
        hidden_shape = (batch, seq, -1, attn.head_dim)
        qkv = attn.qkv_proj(hidden)
        query_pos = config.num_attention_heads * attn.head_dim
        kv = attn.num_key_value_heads * attn.head_dim
        query_states = qkv[..., :query_pos].view(hidden_shape).transpose(1, 2)
        key_states = qkv[..., query_pos:query_pos + kv].view(hidden_shape).transpose(1, 2)
        value_states = qkv[..., query_pos + kv:].view(hidden_shape).transpose(1, 2)
        want_q, want_k = modeling_phi3.apply_rotary_pos_emb(query_states, key_states, cos, sin)
        cache_len = 32
        rows = start + torch.arange(seq, device=device)
        want_kc = torch.randn(batch, config.num_key_value_heads, cache_len, attn.head_dim, device=device,
                              dtype=dtype)
        want_vc = torch.randn_like(want_kc)
        key_cache, value_cache = want_kc.clone(), want_vc.clone()
        want_kc.index_copy_(2, rows, want_k)
        want_vc.index_copy_(2, rows, value_states)
        kvrope_torch.forward_(key_states, value_states, key_cache, value_cache, rows, cos, sin, query=query_states)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(query_states, want_q, **tol)  # rotated in place, inside qkv
    torch.testing.assert_close(key_cache, want_kc, **tol)
    assert torch.equal(value_cache, want_vc)  # v is a copy
