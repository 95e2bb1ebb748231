"""kvrope::mla_append_ (the MLA latent-cache append, docs/spec.md section 6.6: DeepSeek-V2/V3, Kimi K2) against
the float64 reference written here from the definition (reference.mla_append): q_pe rotated in place or into
query_out (q's dtype, or float8_e4m3fn under q_scale) beside a copy of q_nope, the latent row [kv_c | RoPE(k_pe)]
written by slot into vLLM's one cache [pages, P, L + R] or FlashInfer's two ([pages, P, L] and [pages, P, R]), in
T or fp8 under kv_scale, both styles. Every output is poisoned with NaN before the call: what the call must not
write is compared bit for bit after it. Rotated values are within docs/spec.md section 1.7's tolerance of the
float64 value; copies bit-exact; fp8 codes bit-exact from the T value the op rounds to (the same call with
outputs in T), and the float64 value's own code wherever that T value is the float64 value rounded. CPU tests
run everywhere; CUDA tests are skipped without a device."""
import random
from dataclasses import dataclass, replace
from typing import Optional

import pytest
import torch

import kvrope_torch
import reference

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
POISON_BYTE = 0x7F  # NaN in float8_e4m3fn and in float8_e5m2
NAMES = ("query_pe", "kv_c", "k_pe", "positions", "cos_sin_cache")  # the op's first arguments, by position


@dataclass
class Config:
    tokens: int = 13
    q_heads: int = 3
    nope_dim: int = 8              # N
    rotary_dim: int = 8            # R
    latent_dim: int = 24           # L
    dtype: torch.dtype = torch.float32
    style: str = "interleaved"
    layout: str = "concat"         # concat: one cache [pages, P, L + R] (vLLM); split: [.., L] + [.., R] (FlashInfer)
    page_size: int = 4
    pages: int = 8
    padded: bool = False           # the caches views of wider buffers: page and offset strides of their own
    cache: str = "auto"            # auto, fp8_e4m3, fp8_e5m2
    uint8: bool = False            # an fp8 cache as uint8, named by kv_cache_dtype
    kv_scale: Optional[float] = None
    query: Optional[str] = "in_place"  # None, in_place, out, fp8_out
    nope: bool = False             # query_nope given: copied into query_out's first N dims
    q_scale: Optional[float] = None  # fp8_out: q_scale's value (None: no q_scale)
    fused: bool = False            # q_nope, q_pe views of q [T, Hq, N + R]; kv_c, k_pe views of one [T, L + R]
    positions: str = "valid"       # valid, out_of_range
    pos_dtype: torch.dtype = torch.int64
    table_fp32: bool = False
    slots: str = "distinct"        # distinct, padded, repeated, out_of_range
    max_position: int = 40
    seed: int = 0
    enable_pdl: bool = False


def make_inputs(cfg: Config, device):
    """The call's inputs (tensors on `device`; q_pe None without a query)."""
    g = torch.Generator().manual_seed(cfg.seed)
    n, hq, nd, r, lat, dt = cfg.tokens, cfg.q_heads, cfg.nope_dim, cfg.rotary_dim, cfg.latent_dim, cfg.dtype
    q = torch.randn(n, hq, nd + r, generator=g).to(dt)
    kv = torch.randn(n, lat + r, generator=g).to(dt)
    if cfg.cache != "auto" and n:  # kv_c beyond the fp8 range (saturated), k_pe large (fp16's range kept)
        big = 6e4 if cfg.cache == "fp8_e5m2" else 1e3
        kv[0, :2] = torch.tensor([big, -big], dtype=dt)
        kv[-1, lat:lat + 2] = torch.tensor([-big / 2, big / 2], dtype=dt)
    if cfg.query == "fp8_out" and n and hq:  # beyond e4m3's range in q_pe and q_nope: saturated
        q[0, -1, -2:] = torch.tensor([1e3, -1e3], dtype=dt)
        q[-1, 0, :2] = torch.tensor([-2e3, 5e2], dtype=dt)
    q, kv = q.to(device), kv.to(device)
    if cfg.fused:
        q_nope, q_pe, kv_c, k_pe = q[..., :nd], q[..., nd:], kv[:, :lat], kv[:, lat:]
    else:
        q_nope, q_pe = q[..., :nd].clone(), q[..., nd:].clone()
        kv_c, k_pe = kv[:, :lat].clone(), kv[:, lat:].clone()
    inv = 1.0 / (10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    angles = torch.arange(cfg.max_position, dtype=torch.float64)[:, None] * inv[None]
    table = torch.cat((angles.cos(), angles.sin()), dim=-1).to(torch.float32 if cfg.table_fp32 else dt)
    positions = torch.randint(0, cfg.max_position, (n,), generator=g)
    num_slots = cfg.pages * cfg.page_size
    slots = torch.randperm(num_slots, generator=g)[:n]
    if cfg.slots == "padded":
        slots[::3] = -1
    elif cfg.slots == "repeated":
        slots[5], slots[9], slots[11] = slots[2], slots[2], slots[7]
    elif cfg.slots == "out_of_range":
        slots[3], slots[-1] = num_slots, num_slots + 100
    if cfg.positions == "out_of_range":
        positions[1], positions[4] = cfg.max_position, -1
        slots[6] = slots[4]  # a bad position names a slot a later token writes, and one no other token names
    scalar = lambda v: None if v is None else torch.tensor([v], device=device)  # noqa: E731
    return dict(query_pe=q_pe if cfg.query else None, query_nope=q_nope, kv_c=kv_c, k_pe=k_pe,
                positions=positions.to(device=device, dtype=cfg.pos_dtype), cos_sin_cache=table.to(device),
                slot_mapping=slots.to(device), kv_scale=scalar(cfg.kv_scale), q_scale=scalar(cfg.q_scale))


def poisoned(shape, dtype, device, padded=False):
    """An output full of NaN (fp8 and uint8: NaN bytes); `padded`: a view of a wider buffer (more rows a page,
    16 more elements a row), its page and offset strides its own."""
    full = (shape[0], shape[1] + 1, shape[2] + 16) if padded else shape
    x = torch.full(full, POISON_BYTE, dtype=torch.uint8, device=device).view(dtype) if dtype.itemsize == 1 else \
        torch.full(full, float("nan"), dtype=dtype, device=device)
    return x[:shape[0], :shape[1], :shape[2]] if padded else x


def make_outputs(cfg: Config, device, cache="same", query=None):
    """The caches, query_out and the error flag, poisoned. `cache`, `query`: other kinds than cfg's."""
    n, hq, nd, r, lat = cfg.tokens, cfg.q_heads, cfg.nope_dim, cfg.rotary_dim, cfg.latent_dim
    kind = cfg.cache if cache == "same" else cache
    dtype = cfg.dtype if kind == "auto" else (torch.uint8 if cfg.uint8 else FP8[kind])
    rows = lambda w: poisoned((cfg.pages, cfg.page_size, w), dtype, device, cfg.padded)  # noqa: E731
    latent, rope = (rows(lat + r), None) if cfg.layout == "concat" else (rows(lat), rows(r))
    query = cfg.query if query is None else query
    query_out = None
    if query in ("out", "fp8_out"):
        query_out = poisoned((n, hq, nd + r), torch.float8_e4m3fn if query == "fp8_out" else cfg.dtype, device)
    return dict(latent_cache=latent, rope_cache=rope, query_out=query_out,
                error_flag=torch.zeros(1, dtype=torch.int32, device=device))


def kv_cache_dtype(cfg: Config):
    if cfg.cache == "auto" or not cfg.uint8:
        return "auto"
    return "fp8" if cfg.cache == "fp8_e4m3" else cfg.cache


def call(cfg: Config, inputs, outs, **changes):
    """kvrope_torch.mla_append_ with `cfg`'s options (`changes` override keywords)."""
    kw = dict(rope_cache=outs["rope_cache"], query_nope=inputs["query_nope"] if cfg.nope else None,
              query_out=outs["query_out"], kv_cache_dtype=kv_cache_dtype(cfg), kv_scale=inputs["kv_scale"],
              q_scale=inputs["q_scale"], error_flag=outs["error_flag"], style=cfg.style, enable_pdl=cfg.enable_pdl)
    kw.update(changes)
    kvrope_torch.mla_append_(*[inputs[name] for name in NAMES], outs["latent_cache"], inputs["slot_mapping"], **kw)


def raw(x):
    """A tensor on the CPU as compared bit for bit: 1-byte ones as bytes, the others as integers of their size."""
    x = x.cpu()
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def slot_rows(outs, cfg: Config):
    """The caches as (latent rows [slots, L], rope rows [slots, R]) on the CPU, whatever the layout."""
    lat = cfg.latent_dim
    if cfg.layout == "concat":
        rows = outs["latent_cache"].cpu().reshape(-1, lat + cfg.rotary_dim)
        return rows[:, :lat], rows[:, lat:]
    return (outs["latent_cache"].cpu().reshape(-1, lat), outs["rope_cache"].cpu().reshape(-1, cfg.rotary_dim))


def assert_within(name, got, gold, abs_sum, dtype, extra=0.0):
    ok, excess, at = reference.within_tolerance(got, gold, abs_sum, dtype, extra)
    assert ok, (f"{name}: beyond tolerance by {excess:.3g} at flat index {at}: {got.flatten()[at].item()} vs "
                f"{gold.flatten()[at].item()}")


def assert_fp8(name, got, t_values, gold, abs_sum, fmt, scale, dt):
    """fp8 codes `got` (bytes) of T values: exactly reference.fp8 of the op's T values `t_values`; exactly the
    float64 value's code where the T value is the float64 value rounded; within one fp8 step of it elsewhere."""
    s = None if scale is None else scale.cpu()
    want = reference.fp8(t_values, fmt, s).view(torch.uint8)
    assert torch.equal(got, want), f"{name}: not fp8_satfinite(float(x_T) / scale) of the T value"
    rounded = gold.to(dt)
    same = raw(rounded) == raw(t_values)
    mismatch = (got != reference.fp8(rounded, fmt, s).view(torch.uint8)) & same
    assert not bool(mismatch.any()), f"{name}: {int(mismatch.sum())} codes differ from the float64 value's"
    divisor = 1.0 if scale is None else float(scale)
    big = torch.finfo(fmt).max
    extra = (reference.ulp(gold, dt) + 2.0 ** -21 * abs_sum) / divisor
    assert_within(name, got.view(fmt).double(), (gold / divisor).clamp(-big, big), torch.zeros_like(gold), fmt, extra)


def run_and_check(cfg: Config, device):
    inputs = make_inputs(cfg, device)
    before = {name: (x.cpu().clone() if isinstance(x, torch.Tensor) else x) for name, x in inputs.items()}
    outs = make_outputs(cfg, device)
    outs_before = {name: (None if x is None else raw(x).clone()) for name, x in outs.items()}
    call(cfg, inputs, outs)
    # The same call with its outputs in T (the caches, query_out): the values the op rounds to T, which fp8
    # outputs quantize; on inputs as they were (q_pe in place is an output).
    twin = None
    if cfg.cache != "auto" or cfg.query == "fp8_out":
        again = {name: (x.clone().to(device) if isinstance(x, torch.Tensor) else x) for name, x in before.items()}
        twin = make_outputs(cfg, device, cache="auto", query="out" if cfg.query == "fp8_out" else None)
        call(replace(cfg, uint8=False), again, twin, kv_scale=None, q_scale=None)
        twin["query_pe"] = again["query_pe"]
    check_outputs(cfg, before, inputs, outs, outs_before, twin)


def check_outputs(cfg, before, inputs, outs, outs_before, twin):
    dt, nd, r = cfg.dtype, cfg.nope_dim, cfg.rotary_dim
    num_slots = cfg.pages * cfg.page_size
    ref = reference.mla_append(before["query_pe"], before["kv_c"], before["k_pe"], before["positions"],
                               before["cos_sin_cache"], before["slot_mapping"], num_slots, cfg.style)
    ok = ref["valid"]
    assert int(outs["error_flag"]) == ref["flag"], f"error flag {int(outs['error_flag'])}, expected {ref['flag']}"
    for name in ("kv_c", "k_pe", "positions", "cos_sin_cache", "slot_mapping", "query_nope"):
        assert torch.equal(raw(inputs[name]), raw(before[name])), f"{name} changed"
    # q: RoPE(q_pe) where the position is valid, in place or into query_out's last R dims; q_nope beside it
    if before["query_pe"] is not None:
        q_gold, q_abs = ref["q"]
        if cfg.query == "in_place":
            got, initial = inputs["query_pe"].cpu(), before["query_pe"]
            assert_within("query_pe", got[ok], q_gold[ok], q_abs[ok], dt)
            assert torch.equal(raw(got[~ok]), raw(initial[~ok])), "query_pe: a token out of range was written"
        else:
            assert torch.equal(raw(inputs["query_pe"]), raw(before["query_pe"])), "query_pe changed with query_out"
            out, initial = raw(outs["query_out"]), outs_before["query_out"]
            assert torch.equal(out[~ok], initial[~ok]), "query_out: a token out of range was written"
            if not cfg.nope:
                assert torch.equal(out[..., :nd], initial[..., :nd]), "query_out: its first N dims were written"
            if cfg.query == "out":
                got = outs["query_out"].cpu()
                assert_within("query_out", got[ok][..., nd:], q_gold[ok], q_abs[ok], dt)
                if cfg.nope:
                    assert torch.equal(raw(got[ok][..., :nd]), raw(before["query_nope"][ok])), "q_nope: not a copy"
            else:
                t_rot = twin["query_out"].cpu()[..., nd:]
                assert_within("query_out (in T)", t_rot[ok], q_gold[ok], q_abs[ok], dt)
                scale = inputs["q_scale"]
                assert_fp8("query_out (fp8)", out[ok][..., nd:], t_rot[ok], q_gold[ok], q_abs[ok],
                           torch.float8_e4m3fn, scale, dt)
                if cfg.nope:
                    nope = before["query_nope"][ok]
                    want = reference.fp8(nope, torch.float8_e4m3fn, None if scale is None else scale.cpu())
                    assert torch.equal(out[ok][..., :nd], want.view(torch.uint8)), "q_nope (fp8): not its code"
    # the caches: each slot's last valid writer's row, every other row as it was (poisoned)
    written = torch.tensor(sorted(ref["writer"]), dtype=torch.int64)
    tokens = torch.tensor([ref["writer"][s] for s in sorted(ref["writer"])], dtype=torch.int64)
    unwritten = torch.ones(num_slots, dtype=torch.bool)
    unwritten[written] = False
    got_latent, got_rope = (raw(x) for x in slot_rows(outs, cfg))
    init = slot_rows({name: x.view(outs[name].dtype) if x is not None else None
                      for name, x in outs_before.items() if name != "error_flag"}, cfg)
    assert torch.equal(got_latent[unwritten], raw(init[0])[unwritten]), "latent_cache: a row no token names changed"
    assert torch.equal(got_rope[unwritten], raw(init[1])[unwritten]), "rope part: a row no token names changed"
    rows, rows_abs = ref["rows"][tokens], ref["rows_abs"][tokens]
    lat = cfg.latent_dim
    if cfg.cache == "auto":
        assert torch.equal(got_latent[written], raw(before["kv_c"][tokens])), "kv_c: not a bit-exact copy"
        got = slot_rows(outs, cfg)[1][written]
        assert_within("RoPE(k_pe)", got, rows[:, lat:], rows_abs[:, lat:], dt)
        return
    fmt, scale = FP8[cfg.cache], inputs["kv_scale"]
    assert_fp8("kv_c (fp8)", got_latent[written], before["kv_c"][tokens], rows[:, :lat], rows_abs[:, :lat], fmt,
               scale, dt)
    t_rope = slot_rows(twin, cfg)[1][written]
    assert_within("RoPE(k_pe) (in T)", t_rope, rows[:, lat:], rows_abs[:, lat:], dt)
    assert_fp8("RoPE(k_pe) (fp8)", got_rope[written], t_rope, rows[:, lat:], rows_abs[:, lat:], fmt, scale, dt)


# --- the options, one at a time and together ---------------------------------------------------------

CASES = {
    "plain": Config(),
    "rotate_half": Config(style="rotate_half"),
    "split": Config(layout="split"),
    "split_rotate_half": Config(layout="split", style="rotate_half", query="out"),
    "query_out": Config(query="out"),
    "query_out_nope": Config(query="out", nope=True, layout="split"),
    "fused_nope": Config(query="out", nope=True, fused=True),
    "fused_in_place": Config(fused=True, style="rotate_half"),
    "no_query": Config(query=None),
    "no_heads": Config(q_heads=0, query="out", nope=True),
    "no_nope_dims": Config(nope_dim=0, query="out", nope=True),
    "padded_caches": Config(padded=True, layout="split", query="out"),
    "int32_positions": Config(pos_dtype=torch.int32),
    "fp32_table": Config(table_fp32=True),
    "padded_slots": Config(slots="padded"),
    "repeated_slots": Config(slots="repeated", layout="split"),
    "slot_out_of_range": Config(slots="out_of_range", query="out"),
    "position_out_of_range": Config(positions="out_of_range", query="out", nope=True),
    "one_token": Config(tokens=1),
    "no_tokens": Config(tokens=0),
    "page_of_one": Config(page_size=1, pages=32),
    "fp8_e4m3": Config(cache="fp8_e4m3"),
    "fp8_e4m3_uint8_scale": Config(cache="fp8_e4m3", uint8=True, kv_scale=0.5, layout="split"),
    "fp8_e5m2": Config(cache="fp8_e5m2", kv_scale=4.0, style="rotate_half"),
    "fp8_e5m2_uint8": Config(cache="fp8_e5m2", uint8=True, layout="split", padded=True),
    "fp8_query_out": Config(query="fp8_out"),
    "fp8_query_nope_scale": Config(query="fp8_out", nope=True, q_scale=0.25, style="rotate_half"),
    "fp8_everything": Config(query="fp8_out", nope=True, q_scale=3.0, cache="fp8_e4m3", kv_scale=0.5, fused=True,
                             positions="out_of_range", slots="repeated", layout="split", table_fp32=True),
    "fp8_cache_in_place": Config(cache="fp8_e4m3", uint8=True, kv_scale=2.0, fused=True, slots="padded"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cpu_options(case):
    run_and_check(CASES[case], "cpu")


@pytest.mark.parametrize("case, dtype", [(case, dtype) for case in ("plain", "split_rotate_half", "fp8_everything",
                                                                     "fp8_e5m2")
                                          for dtype in (torch.bfloat16, torch.float16, torch.float64)
                                          if not (case.startswith("fp8") and dtype == torch.float64)])
def test_cpu_dtypes(case, dtype):
    """The half types, and float64 (the CPU op's own; the CUDA op has none)."""
    run_and_check(replace(CASES[case], dtype=dtype), "cpu")


@pytest.mark.parametrize("seed", range(8))
def test_cpu_random_configurations(seed):
    run_and_check(random_config(seed, cuda=False), "cpu")


def random_config(seed, cuda):
    """A random call; on CUDA with DeepSeek's sizes (the compiled instance), vector sizes or odd ones."""
    rng = random.Random(seed)
    if cuda:
        nd, r, lat = rng.choice([(128, 64, 512), (64, 32, 256), (2 * rng.randint(0, 40), 2 * rng.randint(1, 40),
                                                                rng.randint(1, 300))])
    else:
        nd, r, lat = 2 * rng.randint(0, 8), 2 * rng.randint(1, 8), rng.randint(1, 40)
    tokens = rng.choice([1, 2, rng.randint(1, 40), rng.randint(12, 300 if cuda else 60)])
    page_size = rng.choice([1, 16, 64, rng.randint(1, 20)])
    cache = rng.choice(["auto", "auto", "fp8_e4m3", "fp8_e5m2"])
    query = rng.choice([None, "in_place", "out", "fp8_out"])
    cfg = Config(tokens=tokens, q_heads=rng.choice([0, 1, 4, 16, 128 if cuda else 5]), nope_dim=nd, rotary_dim=r,
                 latent_dim=lat, dtype=rng.choice([torch.bfloat16, torch.float16, torch.float32]),
                 style=rng.choice(["rotate_half", "interleaved"]), layout=rng.choice(["concat", "split"]),
                 page_size=page_size, pages=(tokens + 10) // page_size + 2, padded=rng.random() < 0.3, cache=cache,
                 uint8=rng.random() < 0.5, kv_scale=rng.choice([None, 0.5, 3.0]) if cache != "auto" else None,
                 query=query, nope=query in ("out", "fp8_out") and rng.random() < 0.6,
                 q_scale=rng.choice([None, 0.5, 2.0]) if query == "fp8_out" else None, fused=rng.random() < 0.5,
                 positions=rng.choice(["valid", "valid", "out_of_range"]) if tokens >= 7 else "valid",
                 pos_dtype=rng.choice([torch.int32, torch.int64]), table_fp32=rng.random() < 0.3,
                 slots=rng.choice(["distinct", "padded", "repeated", "out_of_range"]) if tokens >= 12 else "padded",
                 max_position=tokens + 64, seed=seed)
    return cfg


@pytest.mark.parametrize("device", DEVICES)
def test_enable_pdl(device):
    """enable_pdl (a programmatic dependent launch; the CPU op ignores it) writes what the plain call writes."""
    run_and_check(replace(CASES["fp8_everything"], enable_pdl=True), device)


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_and_flashinfer_layouts_agree(device):
    """One cache [pages, P, L + R] holds, row for row, what the two caches [pages, P, L] and [pages, P, R] hold."""
    cfg = Config(cache="fp8_e4m3", kv_scale=0.5, slots="repeated")
    inputs = make_inputs(cfg, device)
    concat, split = make_outputs(cfg, device), make_outputs(replace(cfg, layout="split"), device)
    call(cfg, inputs, concat)
    call(cfg, make_inputs(cfg, device), split)
    one = raw(concat["latent_cache"])
    assert torch.equal(one[..., :cfg.latent_dim], raw(split["latent_cache"]))
    assert torch.equal(one[..., cfg.latent_dim:], raw(split["rope_cache"]))


@pytest.mark.parametrize("device", DEVICES)
def test_check_option(device):
    """check=True reads the flag after the call (a synchronization) and raises, naming the argument."""
    for kind, message in (("slots", "slot_mapping holds a slot at or above num_pages \\* page_size = 32"),
                          ("positions", r"positions holds a position outside \[0, max_position=40\)")):
        cfg = Config(slots="out_of_range") if kind == "slots" else Config(positions="out_of_range")
        inputs, outs = make_inputs(cfg, device), make_outputs(cfg, device)
        with pytest.raises(ValueError, match=message):
            call(cfg, inputs, outs, error_flag=None, check=True)
    cfg = Config()
    call(cfg, make_inputs(cfg, device), make_outputs(cfg, device), error_flag=None, check=True)  # in range


@pytest.mark.parametrize("device", DEVICES)
def test_refuses_grad_and_overlap(device):
    """In grad mode an input that requires grad is refused; on CUDA kvrope's validate names an output that
    overlaps another (what only the parameters show; the CPU op does not look)."""
    cfg = Config(query="out")
    inputs, outs = make_inputs(cfg, device), make_outputs(cfg, device)
    inputs["kv_c"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="mla_append_ writes in place outside autograd, and kv_c requires grad"):
        call(cfg, inputs, outs)
    with torch.no_grad():
        call(cfg, inputs, outs)
    if device == "cuda":  # rope_cache a view of latent_cache's first R dims: the two outputs overlap
        cfg = Config(layout="split")
        latent = make_outputs(cfg, device)["latent_cache"]
        with pytest.raises(RuntimeError, match=r"kvrope.mla_append_: output overlaps another buffer \(rope_cache"):
            call(cfg, make_inputs(cfg, device), dict(outs, latent_cache=latent),
                 rope_cache=latent[..., :cfg.rotary_dim])


# --- torch's contract: opcheck, the fake kernel, torch.compile, versions -----------------------------

OPCHECK_CASES = ["plain", "fused_nope", "no_query", "padded_caches", "fp8_e4m3_uint8_scale", "fp8_everything"]


def op_args(cfg: Config, device, dtype):
    """torch.ops.kvrope.mla_append_'s arguments for `cfg`."""
    cfg = replace(cfg, dtype=dtype)
    inputs, outs = make_inputs(cfg, device), make_outputs(cfg, device)
    for name in ("latent_cache", "rope_cache", "query_out"):  # NaN compares unequal: opcheck wants outputs equal
        x = outs[name]
        if x is not None:
            (x.view(torch.uint8) if x.element_size() == 1 else x).zero_()
    args = (*[inputs[name] for name in NAMES], outs["latent_cache"], inputs["slot_mapping"])
    kw = dict(rope_cache=outs["rope_cache"], query_nope=inputs["query_nope"] if cfg.nope else None,
              query_out=outs["query_out"], kv_cache_dtype=kv_cache_dtype(cfg), kv_scale=inputs["kv_scale"],
              q_scale=inputs["q_scale"], error_flag=outs["error_flag"], style=0 if cfg.style == "rotate_half" else 1)
    return args, kw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck(device, case):
    """torch's checks of the op: its schema (what it mutates), the fake kernel against the real one, and AOT
    dispatch (torch.compile's functionalization of the mutations)."""
    cfg = CASES[case]
    args, kwargs = op_args(cfg, device, torch.float64 if device == "cpu" else torch.float32)
    # torch's schema check compares tensors with allclose, which has no float8 kernels: float8 caches and an
    # fp8 query_out skip it (the uint8 cases run the same kernels through it)
    float8 = (cfg.cache != "auto" and not cfg.uint8) or cfg.query == "fp8_out"
    tests = tuple(t for t in ("test_schema", "test_autograd_registration", "test_faketensor",
                              "test_aot_dispatch_dynamic") if not (float8 and t == "test_schema"))
    torch.library.opcheck(torch.ops.kvrope.mla_append_.default, args, kwargs, test_utils=tests)


@pytest.mark.parametrize("device", DEVICES)
def test_api_calls_the_op(device):
    """The API calls the op from C++ (kvrope_torch._C) or through torch.ops: the same results; the versions of
    exactly the tensors written are bumped."""
    args, kwargs = op_args(CASES["fp8_everything"], device, torch.float32)
    clones = lambda xs: [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]  # noqa: E731
    names = ["rope_cache", "query_nope", "query_out", "kv_cache_dtype", "kv_scale", "q_scale", "error_flag",
             "style", "enable_pdl"]
    rest = [kwargs.get(name, False if name == "enable_pdl" else None) for name in names]
    a1, r1 = clones(args), clones(rest)
    a2, r2 = clones(args), clones(rest)
    kvrope_torch._C.mla_append_(*a1, *r1)
    torch.ops.kvrope.mla_append_.default(*a2, **dict(zip(names, r2)))
    for x, y in zip(a1 + r1, a2 + r2):
        if isinstance(x, torch.Tensor):
            assert torch.equal(raw(x), raw(y))
    with pytest.raises(TypeError, match="kvrope.mla_append_: kv_cache_dtype must be a str, not int"):
        kvrope_torch._C.mla_append_(*args, *rest[:3], 8, *rest[4:])
    with pytest.raises(TypeError, match="kvrope.mla_append_ takes 16 arguments, not 7"):
        kvrope_torch._C.mla_append_(*args)
    q_pe, kv_c, k_pe, _, _, latent, _ = args = clones(args)
    rope, q_out, flag = (kwargs[name].clone() for name in ("rope_cache", "query_out", "error_flag"))
    before = [x._version for x in (q_pe, kv_c, k_pe, latent, rope, q_out, flag)]
    kvrope_torch.mla_append_(*args, **dict(kwargs, rope_cache=rope, query_out=q_out, error_flag=flag,
                                           style="interleaved"))
    after = [x._version for x in (q_pe, kv_c, k_pe, latent, rope, q_out, flag)]
    assert [a > b for a, b in zip(after, before)] == [False, False, False, True, True, True, True]
    kvrope_torch.mla_append_(*args, rope_cache=rope, kv_cache_dtype="fp8")  # q_pe in place: bumped
    assert q_pe._version > after[0]


def test_compile_matches_eager():
    """torch.compile traces the op with its fake kernel and functionalizes its mutations: the same outputs as
    eager (aot_eager: what inductor would compile is torch's own, test_append.py compiles it)."""
    cfg = CASES["fp8_everything"]

    def step(inputs, outs):
        call(cfg, inputs, outs)
        return inputs["kv_c"] * 2

    eager_in, compiled_in = make_inputs(cfg, "cpu"), make_inputs(cfg, "cpu")
    eager_out, compiled_out = make_outputs(cfg, "cpu"), make_outputs(cfg, "cpu")
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(step(eager_in, eager_out), compiled(compiled_in, compiled_out))
    for name, x in eager_out.items():
        if x is not None:
            assert torch.equal(raw(x), raw(compiled_out[name])), name


# --- CUDA: every path of the kernel ------------------------------------------------------------------

CUDA_SIZES = {  # (N, R, L)
    "deepseek": (128, 64, 512),  # the instance compiled for L = 512, R = 64
    "vector": (64, 32, 256),     # 16-byte accesses, sizes read at run time
    "scalar": (8, 8, 24),        # bf16 / fp16: R / 2 not a chunk of 8: the scalar path (fp32 vectorized)
}


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("sizes", list(CUDA_SIZES))
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_options(case, sizes, dtype):
    nd, r, lat = CUDA_SIZES[sizes]
    cfg = replace(CASES[case], dtype=dtype, nope_dim=nd if CASES[case].nope_dim else 0, rotary_dim=r, latent_dim=lat)
    run_and_check(cfg, "cuda")


@needs_cuda
def test_cuda_many_tokens_and_heads():
    """A prefill's tokens with DeepSeek-V3's 128 heads, repeated slots: the last writer's row."""
    cfg = Config(tokens=700, q_heads=128, nope_dim=128, rotary_dim=64, latent_dim=512, dtype=torch.bfloat16,
                 page_size=64, pages=16, slots="repeated", query="fp8_out", nope=True, q_scale=0.5,
                 cache="fp8_e4m3", kv_scale=0.5, max_position=800)
    run_and_check(cfg, "cuda")


@needs_cuda
@pytest.mark.parametrize("seed", range(30))
def test_cuda_random_configurations(seed):
    run_and_check(random_config(seed, cuda=True), "cuda")


@needs_cuda
def test_cuda_graph_capture_and_replay():
    """Captured once, replayed on new inputs copied into the static ones: the same as eager each time. No
    synchronization or allocation in the call (capture would fail)."""
    cfg = Config(tokens=8, q_heads=16, nope_dim=128, rotary_dim=64, latent_dim=512, dtype=torch.bfloat16,
                 query="fp8_out", nope=True, q_scale=0.5, cache="fp8_e4m3", kv_scale=0.5, slots="padded")
    static, outs = make_inputs(cfg, "cuda"), make_outputs(cfg, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(cfg, static, outs)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(cfg, static, outs)
    for seed in (1, 2):
        fresh = make_inputs(replace(cfg, seed=seed), "cuda")
        for name, x in fresh.items():
            if isinstance(x, torch.Tensor):
                static[name].copy_(x)
        eager = make_outputs(cfg, "cuda")
        for name, x in outs.items():
            if x is not None:
                x.view(torch.uint8).copy_(eager[name].view(torch.uint8)) if x.element_size() == 1 else \
                    x.copy_(eager[name])
        graph.replay()
        call(cfg, fresh, eager)
        torch.cuda.synchronize()
        for name, x in outs.items():
            if x is not None:
                assert torch.equal(raw(x), raw(eager[name])), name
