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
