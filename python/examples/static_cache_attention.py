"""A small attention layer with a static KV cache whose training step writes the roped keys and the
values into the cache through kvrope (forward and backward), checked against the same layer in plain
PyTorch (Hugging Face's apply_rotary_pos_emb and index_copy_).

    python3 python/examples/static_cache_attention.py [--device cuda|cpu] [--steps N]
"""
import argparse

import torch
import torch.nn.functional as F

import kvrope_torch


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_tables(positions, dim, dtype, device):
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = positions.float()[:, None] * inv[None]
    emb = torch.cat((angles, angles), dim=-1)[None]  # [1, S, D], shared by the batch
    return emb.cos().to(dtype), emb.sin().to(dtype)


class StaticCacheAttention(torch.nn.Module):
    """q, k, v projections; RoPE; k and v written into a static cache at cache_position; attention of
    the new tokens over the cache (causal by position); output projection."""

    def __init__(self, hidden, heads, head_dim, use_kvrope):
        super().__init__()
        self.heads, self.head_dim, self.use_kvrope = heads, head_dim, use_kvrope
        self.q = torch.nn.Linear(hidden, heads * head_dim, bias=False)
        self.k = torch.nn.Linear(hidden, heads * head_dim, bias=False)
        self.v = torch.nn.Linear(hidden, heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, key_cache, value_cache, cache_position):
        b, s, _ = x.shape
        shape = (b, s, self.heads, self.head_dim)
        q = self.q(x).view(shape).transpose(1, 2)
        k = self.k(x).view(shape).transpose(1, 2)  # a BSHD tensor seen as [B, H, S, D]
        v = self.v(x).view(shape).transpose(1, 2)
        cos, sin = rope_tables(cache_position, self.head_dim, x.dtype, x.device)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        if self.use_kvrope:
            key_cache, value_cache, _ = kvrope_torch.forward(k, v, key_cache, value_cache, cache_position, cos, sin)
        else:  # Hugging Face: apply_rotary_pos_emb, then StaticCache.update's index_copy_
            k = k * cos[:, None] + rotate_half(k) * sin[:, None]
            key_cache = key_cache.index_copy(2, cache_position, k)
            value_cache = value_cache.index_copy(2, cache_position, v)
        rows = torch.arange(key_cache.shape[2], device=x.device)
        mask = rows[None, :] <= cache_position[:, None]  # [S, S_max]
        out = F.scaled_dot_product_attention(q, key_cache, value_cache, attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(b, s, -1)), key_cache, value_cache


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    dtype = torch.float32
    hidden, heads, head_dim, batch, max_len, step_len = 64, 4, 16, 2, 32, 5
    layers = {}
    for name, use in (("kvrope", True), ("torch", False)):
        torch.manual_seed(0)
        layers[name] = StaticCacheAttention(hidden, heads, head_dim, use).to(args.device, dtype)
    opts = {n: torch.optim.SGD(l.parameters(), lr=0.1) for n, l in layers.items()}
    worst = 0.0
    for step in range(args.steps):
        x = torch.randn(batch, step_len, hidden, device=args.device, dtype=dtype)
        target = torch.randn_like(x)
        position = torch.arange(step * step_len, (step + 1) * step_len, device=args.device)
        results = {}
        for name, layer in layers.items():
            kc = torch.zeros(batch, heads, max_len, head_dim, device=args.device, dtype=dtype, requires_grad=True)
            vc = torch.zeros_like(kc, requires_grad=True)
            out, _, _ = layer(x, kc, vc, position)
            loss = F.mse_loss(out, target)
            opts[name].zero_grad()
            loss.backward()
            opts[name].step()
            results[name] = (loss.detach(), [p.grad.clone() for p in layer.parameters()], kc.grad)
        (la, ga, ca), (lb, gb, cb) = results["kvrope"], results["torch"]
        diffs = [float((a - b).abs().max()) for a, b in zip(ga + [ca], gb + [cb])]
        worst = max(worst, max(diffs), float((la - lb).abs()))
        print(f"step {step}: loss kvrope {la.item():.6f}, torch {lb.item():.6f}; "
              f"largest gradient difference {max(diffs):.2e}")
    assert worst < 1e-4, f"kvrope and plain PyTorch differ by {worst}"
    print(f"kvrope and plain PyTorch agree on {args.device} (largest difference {worst:.2e})")


if __name__ == "__main__":
    main()
