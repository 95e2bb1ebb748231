"""The tests' own eager reference, written from the op's definition (docs/spec.md sections 1-2) and
Hugging Face's steps: ``apply_rotary_pos_emb`` on k, then ``index_copy_`` into the caches, in float64.
The backward is autograd through it; the MLA append (section 6.6) token by token. Independent of
kvrope_torch's code."""
import torch

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52,
                 torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126, torch.float64: -1022,
                torch.float8_e4m3fn: -6, torch.float8_e5m2: -14}


def rotate_half(x):  # Hugging Face's
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_interleaved(x):  # GPT-J's pairs (2i, 2i + 1)
    out = torch.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def apply_rotary(x, cos, sin, style):
    """x [B, H, S, D], tables [B or 1, S, R]: the first R elements rotated, the rest passed."""
    r = cos.shape[-1]
    rot = rotate_half if style == "rotate_half" else rotate_interleaved
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x[..., :r] * c + rot(x[..., :r]) * s, x[..., r:]), dim=-1)


def rotary_abs_sum(x, cos, sin, style):
    """The sum of the absolute values of the products making up each rotated element (the tolerance's A)."""
    r = cos.shape[-1]
    rot = rotate_half if style == "rotate_half" else rotate_interleaved
    c, s = cos.unsqueeze(1).abs(), sin.unsqueeze(1).abs()
    a = x[..., :r].abs() * c + rot(x[..., :r]).abs() * s
    return torch.cat((a, torch.zeros_like(x[..., r:])), dim=-1)


def wrap(cache_position, cache_len):
    p = cache_position.to(torch.int64)
    return torch.where(p < 0, p + cache_len, p)


def forward(k, v, key_cache, value_cache, cache_position, cos, sin, style):
    """New caches and RoPE(k), float64; positions distinct and in range (index_copy_'s contract)."""
    k_rot = apply_rotary(k, cos, sin, style)
    rows = wrap(cache_position, key_cache.shape[2])
    return key_cache.index_copy(2, rows, k_rot), value_cache.index_copy(2, rows, v), k_rot


def forward_sequential(k, v, key_cache, value_cache, cache_position, cos, sin, style):
    """The same, token by token in order (repeated rows: the last token wins); out-of-range tokens skip."""
    k_rot = apply_rotary(k, cos, sin, style)
    kc, vc = key_cache.clone(), value_cache.clone()
    n = key_cache.shape[2]
    for t, p in enumerate(cache_position.tolist()):
        if -n <= p < n:
            kc[:, :, p % n] = k_rot[:, :, t]
            vc[:, :, p % n] = v[:, :, t]
    return kc, vc, k_rot


def ulp(x, dtype):
    """The spacing of dtype's numbers at |x| (float64), subnormals' below the smallest normal."""
    exponent = torch.floor(torch.log2(x.double().abs().clamp_min(1e-300))).clamp_min(MIN_EXPONENT[dtype])
    return torch.pow(2.0, exponent - MANTISSA_BITS[dtype])


def within_tolerance(out, gold, abs_sum, dtype, extra=0.0):
    """|out - gold| <= ulp_dtype(gold) + 2^-21 A (docs/spec.md section 1.7) (+ extra), elementwise; returns the
    worst excess and its index for the message."""
    out, gold, abs_sum = out.double(), gold.double(), abs_sum.double()
    excess = (out - gold).abs() - (ulp(gold, dtype) + 2.0 ** -21 * abs_sum + extra)
    worst = int(torch.argmax(excess)) if excess.numel() else 0
    return bool((excess <= 0).all()), (excess.flatten()[worst].item() if excess.numel() else 0.0), worst


# --- the serving forward's fp8 query_out (kvrope::rope_append_ with a float8_e4m3fn query_out) ------

FP8_E4M3_MAX = 448.0


def table_rotary(x, cos_sin_cache, positions, style, rotary_dim=0):
    """x [T, H, D] (float64) rotated by a table cache [max_pos, R] (cos in columns [0, R/2), sin in
    [R/2, R), one angle a pair), row positions[t] for token t; rotary_dim 0: R. Through apply_rotary with
    per-token tables spread to one value an element (rotate-half: pair i is (i, i + R/2); interleaved:
    (2i, 2i + 1)). Positions out of range are clamped (their tokens are not compared)."""
    r = rotary_dim or cos_sin_cache.shape[1]
    rows = cos_sin_cache.double()[positions.long().clamp(0, cos_sin_cache.shape[0] - 1)]  # [T, R]
    cos, sin = rows[:, :r // 2], rows[:, r // 2:r]
    spread = (lambda t: torch.cat((t, t), -1)) if style == "rotate_half" else (lambda t: t.repeat_interleave(2, -1))
    out = apply_rotary(x.double().transpose(0, 1)[None], spread(cos)[None], spread(sin)[None], style)
    return out[0].transpose(0, 1)


def table_rotary_abs_sum(x, cos_sin_cache, positions, style):
    """table_rotary's tolerance term A (rotary_abs_sum) for x [T, H, R] (all R elements rotated)."""
    r = cos_sin_cache.shape[1]
    rows = cos_sin_cache.double()[positions.long().clamp(0, cos_sin_cache.shape[0] - 1)]
    cos, sin = rows[:, :r // 2], rows[:, r // 2:r]
    spread = (lambda t: torch.cat((t, t), -1)) if style == "rotate_half" else (lambda t: t.repeat_interleave(2, -1))
    out = rotary_abs_sum(x.double().transpose(0, 1)[None], spread(cos)[None], spread(sin)[None], style)
    return out[0].transpose(0, 1)


def rms_norm(x, weight, eps, plus_one=False):
    """Per-head RMSNorm over the last dim in float64: x / sqrt(mean(x^2) + eps) * w (Gemma: 1 + w)."""
    w = weight.double() + (1.0 if plus_one else 0.0)
    return x.double() / torch.sqrt(x.double().square().mean(-1, keepdim=True) + eps) * w


def fp8_e4m3(x, scale=None):
    """x (in its dtype T) as an fp8 output stores it: fp8_satfinite(float(x) / scale), the division in
    float32 (scale: one float32, None: 1), saturated at +-448 (NaN stays NaN), cast to float8_e4m3fn."""
    x = x.float()
    if scale is not None:
        x = x / scale.float().reshape(())
    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def fp8_query(q, cos_sin_cache, positions, style, rotary_dim=0, scale=None, norm_weight=None, eps=1e-6,
              plus_one=False):
    """What an fp8 query_out holds: q [T, Hq, D] (optionally RMS-normed) rotated in float64, rounded to
    q's dtype once, then fp8_e4m3 (divided by the scale in float32, saturated, cast)."""
    x = q.double()
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps, plus_one)
    return fp8_e4m3(table_rotary(x, cos_sin_cache, positions, style, rotary_dim).to(q.dtype), scale)


# --- the serving forward's NVFP4 caches (kv_cache_dtype "nvfp4", docs/spec.md section 6.4) -----------

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MIN_NORMAL = 2.0 ** -126


def _f32(x):
    """A float64 tensor rounded to float32 once, with fp32's flush to zero (a subnormal: a zero of its sign)."""
    y = x.float().double()
    return torch.where(y.abs() < MIN_NORMAL, torch.copysign(torch.zeros_like(y), y), y)


def nvfp4(x, g=None):
    """NVFP4 blocks of rows x [..., H, D] (in their dtype T) under the global scale g (None: 1; one float32 or
    [H]), from the rule of docs/spec.md 6.4 in float64, each fp32 step rounded once: amax of the 16 values
    (NaN skipped); q = fl(amax / fl(6 g)); s = e4m3(q) (nearest even, saturating); r = fl(1 / fl(s g)); code of
    each element: the e2m1 magnitude nearest fl(x r), ties to the even code, above 6 saturated, x r's sign
    (NaN: +0); g below 2^126 / 6 (beyond, the GPU's division gives 0). Returns (codes [..., H, D / 2] uint8,
    even element low; scales [..., H, D / 16] uint8)."""
    x = _f32(x.double())
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    g = torch.ones(1, 1, dtype=torch.float64) if g is None else g.double().cpu().reshape(-1, 1)
    amax = torch.nan_to_num(blocks.abs(), nan=0.0).amax(-1)
    live = (amax >= MIN_NORMAL) & (g >= MIN_NORMAL)
    q = torch.where(live, _f32(amax / _f32(6.0 * g)), torch.zeros_like(amax))
    s = q.float().clamp(max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    sv = s.double()
    r = torch.where(live & (sv > 0), _f32(1.0 / _f32(sv * g)), torch.zeros_like(sv))
    y = _f32(blocks * r[..., None])
    magnitudes = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)
    distance = (y.abs().clamp(max=6.0)[..., None] - magnitudes).abs()
    best = _nearest_even(distance)
    sign = torch.where(torch.isnan(y), 0, torch.signbit(y).long() * 8)
    code = torch.where(torch.isnan(y), 0, sign | best)
    pairs = code.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8), s.view(torch.uint8)


def _nearest_even(distance):
    """The index of the smallest distance (the last dim), the even one of two equal."""
    best = torch.zeros(distance.shape[:-1], dtype=torch.long)
    best_d = distance[..., 0]
    for c in range(1, 8):
        d = distance[..., c]
        take = (d < best_d) | ((d == best_d) & (c % 2 == 0))
        best = torch.where(take, c, best)
        best_d = torch.where(take, d, best_d)
    return best


# --- the MLA append (kvrope::mla_append_, docs/spec.md section 6.6) -----------------------------------

def fp8(x, fmt, scale=None):
    """x (in its dtype T) as an fp8 cache of format fmt stores it: fp8_satfinite(float(x) / scale) (scale one
    float32, None: 1), the quotient in float32, saturated at the format's largest finite value, as fmt."""
    x = x.float()
    if scale is not None:
        x = x / scale.float().reshape(())
    big = torch.finfo(fmt).max
    return x.clamp(-big, big).to(fmt)


def mla_append(q_pe, kv_c, k_pe, positions, cos_sin_cache, slot_mapping, num_slots, style):
    """The MLA append in float64, token by token in order, on CPU copies: RoPE(q_pe) [T, Hq, R] and its A (a
    token whose position is outside [0, max_pos) keeps its rows: `valid`); for each slot of [0, num_slots) the
    token whose row [kv_c | RoPE(k_pe)] it holds (the last valid token naming it) in `writer`, the rows
    [T, L + R] and their A in `rows` and `rows_abs` (kv_c's A zero: a copy); and the error flag's bits."""
    ok = (positions >= 0) & (positions < cos_sin_cache.shape[0])
    q = None if q_pe is None else (table_rotary(q_pe, cos_sin_cache, positions, style),
                                   table_rotary_abs_sum(q_pe, cos_sin_cache, positions, style))
    k = table_rotary(k_pe[:, None], cos_sin_cache, positions, style)[:, 0]
    k_abs = table_rotary_abs_sum(k_pe[:, None], cos_sin_cache, positions, style)[:, 0]
    writer, flag = {}, 0
    for t in range(kv_c.shape[0]):
        s = int(slot_mapping[t])
        if not ok[t]:
            flag |= 2  # ERROR_POSITION_ID_OUT_OF_RANGE: the token writes nothing
        elif s >= num_slots:
            flag |= 4  # ERROR_SLOT_OUT_OF_RANGE: no cache row
        elif s >= 0:
            writer[s] = t
    rows = torch.cat((kv_c.double(), k), -1)
    rows_abs = torch.cat((torch.zeros_like(kv_c, dtype=torch.float64), k_abs), -1)
    return dict(valid=ok, q=q, writer=writer, rows=rows, rows_abs=rows_abs, flag=flag)
