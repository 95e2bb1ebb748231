#!/usr/bin/env python3
"""FlashInfer's serving kernels against kvrope's on the cases of kvrope_bench's serve suites
(--suite=serve-decode|serve-prefill: the same ids, page tables and positions, made by the same generator as
bench/support/append_cases.hpp). bf16 q, k, v as views of one qkv [T, (Hq + 2 H) D], H = 8, D = 128, pages
of 16 with shuffled page ids, an fp32 table cache [max_position, 128], rotate-half.

Timed, where each applies:
- FlashInfer's fused bf16 kernel cake_fused_qk_rmsnorm_rope_append_paged_kv_cache ((Hq, H) in {(8, 1),
  (64, 8)}, D = 128, bf16 NHD caches only; norm off, the last page's unused rows not cleared: the same work
  as kvrope's, q written to out_q);
- its fused fp8 kernel rope_quantize_fp8_append_paged_kv_cache (fp8 e4m3 caches, NHD or HND; it writes q
  quantized to fp8, one byte an element where kvrope writes bf16): on the fp8-cache cases with q scale 1, and on
  the q-fp8 cases (cache "fp8_e4m3+q8", decode ids 49-72, prefill 33-48: the fp8-cache cases again, appended
  after the others so that the ids above keep their meaning) with the cases' query scale, where it does kvrope's
  work exactly (kvrope writes q to query_out_fp8 as fp8_satfinite(RoPE(q) / 0.02); FlashInfer multiplies by
  quant_scale_q = 1 / 0.02);
- its two launches apply_rope_with_cos_sin_cache_inplace (q and k in place) then append_paged_kv_cache
  (bf16 caches);
- on the NVFP4 cases (cache "nvfp4", decode ids 73-96, prefill 49-64: the bf16 cases' shapes with NVFP4
  caches), its pair apply_rope_with_cos_sin_cache_inplace (q and k in place) then
  nvfp4_quantize_append_paged_kv_cache_with_slot_mapping (k and v; global scales the cases' k 0.0125, v 0.015),
  column "FI r+fp4": its custom op called with the scales as prebuilt device tensors (the public function
  validates them with a host copy each call, which the span would include; the function itself where the op
  is not found, said once);
- kvrope through the PyTorch package (kvrope_torch.rope_append_, k read only, and with key_in_place as the
  two launches do), where the package is importable; else those columns are left out. On the q-fp8 cases only
  where rope_append_ takes q_scale (an fp8 query_out); else left out there (kvrope_bench times those cases).
  NVFP4: kv_cache_dtype="nvfp4" with the block scales; mRoPE cases (cache "bf16+mrope", decode 97-120,
  prefill 65-80: the bf16 cases with positions [3, T], sections {16, 24, 24}): mrope_section, where
  rope_append_ takes it. FlashInfer has no mRoPE kernel: its columns are empty there.
- on the MLA cases (cache "mla_bf16", "mla_fp8+q8", layout "L+R", decode ids 121-144, prefill 81-96: the same
  shapes at Hq 16 and 128, L 512, R 64, interleaved; one cache [pages, P, L + R], FlashInfer's ckv and kpe views of
  it): FlashInfer's pair apply_rope_with_cos_sin_cache_inplace (q_pe and k_pe in place) then
  append_paged_mla_kv_cache (bf16, column "FI r+a"), its fused rope_quantize_fp8_append_paged_kv_cache in MLA
  mode (k_rope 2-D, v None: q_nope [T, Hq, 512] and RoPE(q_pe) to fp8, kv_c and RoPE(k_pe) to the fp8 cache;
  column "FI fp8"), and kvrope_torch.mla_append_ (q_pe in place; or q_nope and RoPE(q_pe) to an fp8 query_out),
  where the package has it (the MLA op of python/), else that column is left out with the reason printed.

Protocol (docs/benchmarks.md): before each call the L2 is flushed (a buffer of twice the L2 written) and the
device synchronized; a call's time is its kernels' span (first start to last end) from CUPTI through
torch.profiler; median of --iters calls. A small ragged case is first checked against a PyTorch reference for
every method, layout and cache type (NVFP4: kvrope's codes and block scales bit for bit what FlashInfer's
quantizer writes from the same rotated k and v, and the FlashInfer pair's too; MLA: each method against an
interleaved PyTorch RoPE, then FlashInfer's outputs against kvrope's, the elements that differ counted). On the GPU
machine (no downloads), from the repository root:

    source dev/scripts/flashinfer_setup.sh && python3 bench/flashinfer_compare.py [--iters 50] [--json out.json]

FlashInfer's package __init__ imports every kernel family, which the reduced wheel lacks: its flashinfer,
flashinfer.jit and flashinfer.quantization packages are entered as stubs and only the rope, page and Cake
modules imported. Its JIT builds (nvcc, about a minute) go to $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer;
--build-only builds them and exits, so that they can overlap other work.
"""
import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import statistics
import sys
import time
import types

import torch

MASK = (1 << 64) - 1
KEY_SCALE, VALUE_SCALE = 0.0125, 0.015  # bench/support/append_cases.hpp's fp8 scales
QUERY_SCALE = 0.02  # append_cases.hpp's kAppendQueryScale: the q-fp8 cases' query_out_fp8 = fp8(RoPE(q) / 0.02)
S_MAX = 4096
DECODE_BATCHES = (1, 8, 32, 128, 256, 1024)
PREFILL_SHAPES = ((8, 512), (1, 2048), (4, 1024), (1, 8192))
QUERY_HEADS = (32, 64)
FP8 = torch.float8_e4m3fn
NVFP4_BLOCK = 16  # an e4m3 block scale a block of 16 values along D
FP8_MAX = 448.0
DEVICE = "cuda"
# The MLA cases (append_cases.hpp's kMla*): L = 512, R = 64 (interleaved pairs), Hq 16 and 128; q [T, Hq, N + R]
# with N = 128 (bf16 cases: q_pe rotated in place) or N = L = 512 (q-fp8 cases: q_nope absorbed, written whole to
# fp8 with RoPE(q_pe)); the fp8 latent cache's scale; one cache [pages, P, L + R] (vLLM's layout, "L+R").
MLA_QUERY_HEADS = (16, 128)
MLA_LATENT, MLA_ROTARY, MLA_NOPE, MLA_NOPE_FP8 = 512, 64, 128, 512
MLA_KV_SCALE = 0.015


# --- the cases, as bench/support/append_cases.hpp makes them -----------------------------------------------

class SplitMix:
    """splitmix64 steps; below(n) = next() % n (append_cases.hpp's SplitMix)."""

    def __init__(self, state):
        self.state = state & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def case_table(decode, heads=8, head_dim=128, page_size=16):
    """Every case of a serve suite, numbered from 1: shapes, then Hq, the cache, the layout; then every
    fp8-cache case again with q written in fp8 (q8: decode 49-72, prefill 33-48); then the bf16 cases' shapes
    with NVFP4 caches (decode 73-96, prefill 49-64); then every bf16 case again with mRoPE positions (mrope,
    twin its id: decode 97-120, prefill 65-80); then the MLA cases (mla: shapes, Hq 16 and 128, bf16 and fp8
    with q in fp8: decode 121-144, prefill 81-96), as append_case_table."""
    shapes = [(b, 1) for b in DECODE_BATCHES] if decode else list(PREFILL_SHAPES)
    cases = []
    for seqs, length in shapes:
        for hq in QUERY_HEADS:
            for cache in ("bf16", "fp8_e4m3"):
                for layout in ("NHD", "HND"):
                    s_max = -(-length // page_size) * page_size if length > S_MAX else S_MAX
                    cases.append(dict(id=len(cases) + 1, decode=decode, seqs=seqs, tokens_per_seq=length,
                                      s_max=s_max, hq=hq, h=heads, d=head_dim, page_size=page_size,
                                      max_position=s_max, cache=cache, layout=layout, q8=False, mrope=False,
                                      twin=0))
    # The q-fp8 cases, after all the others (the ids above never change); then the NVFP4 and the mRoPE cases.
    fp8_cases = [c for c in cases if c["cache"] != "bf16"]
    bf16_cases = [c for c in cases if c["cache"] == "bf16"]
    for c in fp8_cases:
        cases.append(dict(c, id=len(cases) + 1, q8=True))
    for c in bf16_cases:
        cases.append(dict(c, id=len(cases) + 1, cache="nvfp4"))
    for c in bf16_cases:
        cases.append(dict(c, id=len(cases) + 1, mrope=True, twin=c["id"]))
    for seqs, length in shapes:
        for hq in MLA_QUERY_HEADS:
            for fp8 in (False, True):
                s_max = -(-length // page_size) * page_size if length > S_MAX else S_MAX
                cases.append(dict(id=len(cases) + 1, decode=decode, seqs=seqs, tokens_per_seq=length, s_max=s_max,
                                  hq=hq, h=1, d=MLA_ROTARY, page_size=page_size, max_position=s_max,
                                  cache="fp8_e4m3" if fp8 else "bf16", layout="L+R", q8=fp8, mrope=False, twin=0,
                                  mla=True, latent=MLA_LATENT, nope=MLA_NOPE_FP8 if fp8 else MLA_NOPE))
    return cases


def cache_label(c):
    """The cache column: the cache's type, "+q8" where q is written in fp8 too, "+mrope" with mRoPE positions
    (append_cache_label); the MLA cases "mla_bf16", "mla_fp8+q8" (AppendCase::cache_label)."""
    if c.get("mla"):
        return "mla_fp8+q8" if c["q8"] else "mla_bf16"
    return c["cache"] + ("+q8" if c.get("q8") else "") + ("+mrope" if c.get("mrope") else "")


def group(c):
    """The case's group (AppendCase::group): "mla", "nvfp4", "mrope", or "base" (the cases the means always
    covered)."""
    if c.get("mla"):
        return "mla"
    return "nvfp4" if c["cache"] == "nvfp4" else "mrope" if c.get("mrope") else "base"


def mrope_sections(c):
    """Qwen2-VL's {16, 24, 24} scaled to R = D (AppendCase::mrope_sections)."""
    d = c["d"]
    return [d // 8, 3 * d // 16, d // 2 - d // 8 - 3 * d // 16]


def mrope_positions(c, positions):
    """The mRoPE cases' [3, T] streams from the twin's positions p: p, p // 2, max_position - 1 - p
    (append_tokens)."""
    return [list(positions), [p // 2 for p in positions], [c["max_position"] - 1 - p for p in positions]]


def shape_name(c):
    return f"T={c['seqs']}" if c["decode"] else f"{c['seqs']}x{c['tokens_per_seq']}"


def case_bytes(c, key_written=False):
    """append_cases.hpp's append_bytes: q read and written (in 1 byte for the q-fp8 cases), k and v read, the
    cache rows, a table row, the position and the slot, a token; the MLA cases' mla_bytes (mla_case_bytes)."""
    if c.get("mla"):
        return mla_case_bytes(c)
    hq, h, d = c["hq"], c["h"], c["d"]
    ce = 2 if c["cache"] == "bf16" else 1
    qe = 1 if c.get("q8") else 2
    rows = 2 * h * (d // 2 + d // NVFP4_BLOCK) if c["cache"] == "nvfp4" else ce * 2 * h * d
    per_token = ((2 + qe) * hq * d + 2 * 2 * h * d + rows + 4 * d + 16 + (16 if c.get("mrope") else 0) +
                 (2 * h * d if key_written else 0))
    return per_token * c["seqs"] * c["tokens_per_seq"]


def mla_case_bytes(c):
    """append_cases.hpp's mla_bytes, a token: q_pe read (2 Hq R); q_pe written in place (2 Hq R, bf16 cases) or
    q_nope read and the rows written in fp8 (2 Hq N + Hq (N + R), q-fp8 cases); kv_c and k_pe read (2 (L + R)); the
    latent row written (L + R in the cache's element); a table row (4 R); the position and the slot (16)."""
    hq, n, r, l = c["hq"], c["nope"], c["d"], c["latent"]
    ce = 1 if c["q8"] else 2
    q = 2 * hq * r + (2 * hq * n + hq * (n + r) if c["q8"] else 2 * hq * r)
    return (q + 2 * (l + r) + ce * (l + r) + 4 * r + 16) * c["seqs"] * c["tokens_per_seq"]


def append_tokens(c, seed):
    """append_cases.hpp's append_tokens: (page_table [seqs][pages_per_seq], positions, slots, starts, lengths)."""
    seqs, length, p = c["seqs"], c["tokens_per_seq"], c["page_size"]
    pps = c["s_max"] // p
    pages = seqs * pps
    rng = SplitMix(seed + 1000003 * seqs + length)
    perm = list(range(pages))
    for i in range(pages - 1, 0, -1):
        j = rng.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    table = [perm[b * pps:(b + 1) * pps] for b in range(seqs)]
    positions, slots = [], []
    for b in range(seqs):
        for i in range(length):
            pos = rng.below(c["s_max"]) if c["decode"] else i
            positions.append(pos)
            slots.append(table[b][pos // p] * p + pos % p)
    starts = [positions[b * length] for b in range(seqs)]
    return table, positions, slots, starts, [length] * seqs


def rope_table(max_position, rotary_dim):
    """cos | sin of position * 10000^(-2i / R), in float64 then fp32 (append_case.cuh's rope_table)."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    angle = torch.arange(max_position, dtype=torch.float64)[:, None] * torch.pow(10000.0, -2.0 * i / rotary_dim)
    return torch.cat([angle.cos(), angle.sin()], dim=1).float().to(DEVICE)


class Problem:
    """One case's tensors, shared by its methods: qkv and its views, the caches, and each API's metadata
    built from the one page table (kvrope: positions and slots; FlashInfer: batch_indices, positions,
    kv_indptr / kv_indices / kv_last_page_len over each sequence's pages in use, and for the Cake kernel
    seq_lens, q_indptr and the dense page table). An MLA case has q [T, Hq, N + R] and kv [T, L + R] (kv_c, k_pe)
    instead of qkv, one cache [pages, P, L + R] (FlashInfer's ckv and kpe: views of it) and out_q8 [T, Hq, N + R]."""

    def __init__(self, c, tokens, table, zero_caches=False, seed=0):
        page_table, positions, slots, starts, lengths = tokens
        self.c = c
        hq, h, d, p = c["hq"], c["h"], c["d"], c["page_size"]
        self.T = t = len(positions)
        self.B = b = len(lengths)
        cuda = dict(device=DEVICE)
        torch.manual_seed(seed)
        self.mla = bool(c.get("mla"))
        if self.mla:  # q [T, Hq, N + R], kv [T, L + R]
            self.q = torch.randn(t, hq, c["nope"] + d, dtype=torch.bfloat16, **cuda)
            self.kv = torch.randn(t, c["latent"] + d, dtype=torch.bfloat16, **cuda)
        else:
            self.qkv = torch.randn(t, (hq + 2 * h) * d, dtype=torch.bfloat16, **cuda)
        self.table = table
        self.positions = torch.tensor(positions, dtype=torch.int64, **cuda)
        # mRoPE: [3, T] (kvrope's positions there); FlashInfer's metadata below reads the twin's positions.
        self.sections = mrope_sections(c) if c.get("mrope") else None
        self.positions3 = (torch.tensor(mrope_positions(c, positions), dtype=torch.int64, **cuda)
                           if c.get("mrope") else None)
        self.slots = torch.tensor(slots, dtype=torch.int64, **cuda)
        pages = b * (c["s_max"] // p)
        nvfp4 = c["cache"] == "nvfp4"
        row = d // 2 if nvfp4 else d  # NVFP4: uint8 codes [.., D / 2], e4m3 block scales [.., D / 16]
        shape = (pages, p, h, row) if c["layout"] == "NHD" else (pages, h, p, row)
        dtype = torch.bfloat16 if c["cache"] == "bf16" else torch.uint8 if nvfp4 else FP8
        make = torch.zeros if zero_caches else torch.empty
        if self.mla:  # one cache [pages, P, L + R]; no k and v caches
            shape = (pages, p, c["latent"] + d)
            self.kc = self.vc = None
            self.cache = make(shape, dtype=dtype, **cuda)
            self.ckv, self.kpe = self.cache[..., :c["latent"]], self.cache[..., c["latent"]:]
            self.kv_scale = torch.tensor([MLA_KV_SCALE], dtype=torch.float32, **cuda)
        else:
            self.kc, self.vc = make(shape, dtype=dtype, **cuda), make(shape, dtype=dtype, **cuda)
        self.ksf = self.vsf = None
        if nvfp4:
            sf_shape = shape[:-1] + (d // NVFP4_BLOCK,)
            self.ksf, self.vsf = (torch.zeros(sf_shape, dtype=torch.uint8, **cuda).view(FP8) for _ in range(2))
        self.k_scale = torch.tensor([KEY_SCALE], dtype=torch.float32, **cuda)
        self.v_scale = torch.tensor([VALUE_SCALE], dtype=torch.float32, **cuda)
        self.q_scale = torch.tensor([QUERY_SCALE], dtype=torch.float32, **cuda)
        ends = [s + n for s, n in zip(starts, lengths)]  # each sequence's length after the append
        used = [-(-e // p) for e in ends]
        i32 = dict(dtype=torch.int32, **cuda)
        self.batch_indices = torch.tensor([bi for bi in range(b) for _ in range(lengths[bi])], **i32)
        self.positions32 = self.positions.int()
        self.kv_indptr = torch.tensor([sum(used[:bi]) for bi in range(b + 1)], **i32)
        self.kv_indices = torch.tensor([pg for bi in range(b) for pg in page_table[bi][:used[bi]]], **i32)
        self.kv_last_page_len = torch.tensor([(e - 1) % p + 1 for e in ends], **i32)
        self.seq_lens = torch.tensor(ends, **i32)
        self.q_indptr = torch.tensor([sum(lengths[:bi]) for bi in range(b + 1)], **i32)
        self.page_indices = torch.tensor(page_table, **i32)
        self.out_q = torch.empty(t, hq, d, dtype=torch.bfloat16, **cuda)
        self.out_q8 = torch.empty(t, hq, d, dtype=FP8, **cuda)
        if self.mla:  # q [T, Hq, N + R] in fp8 (q-fp8 cases)
            self.out_q = None
            self.out_q8 = make(t, hq, c["nope"] + d, dtype=FP8, **cuda)

    def mla_views(self):
        """An MLA case's q_nope [T, Hq, N], q_pe [T, Hq, R] (views of q), kv_c [T, L], k_pe [T, R] (of kv)."""
        n, l = self.c["nope"], self.c["latent"]
        return self.q[..., :n], self.q[..., n:], self.kv[:, :l], self.kv[:, l:]

    def mla_rows(self):
        """The cache's rows of the tokens' slots, [T, L + R] (bits read as integers, viewed back)."""
        bits = self.cache.view(torch.uint8 if self.cache.element_size() == 1 else torch.int16)
        return bits.reshape(-1, self.cache.shape[-1])[self.slots].view(self.cache.dtype)

    def mla_other_rows_nonzero(self):
        """Elements of the cache's rows no token names that are not zero (the cache starts zeroed)."""
        bits = self.cache.view(torch.uint8 if self.cache.element_size() == 1 else torch.int16)
        bits = bits.reshape(-1, self.cache.shape[-1])
        mask = torch.ones(bits.shape[0], dtype=torch.bool, device=bits.device)
        mask[self.slots] = False
        return int((bits[mask] != 0).sum().item())

    def views(self):
        hq, h, d = self.c["hq"], self.c["h"], self.c["d"]
        q = self.qkv[:, :hq * d].view(self.T, hq, d)
        k = self.qkv[:, hq * d:(hq + h) * d].view(self.T, h, d)
        v = self.qkv[:, (hq + h) * d:].view(self.T, h, d)
        return q, k, v

    def _slot_rows(self, cache):
        """The cache's bits as [slots, H, row] (indexed as integers: fp8 indexing need not be supported; row D,
        or an NVFP4 cache's D / 2 code bytes or D / 16 block scales)."""
        c = cache if self.c["layout"] == "NHD" else cache.transpose(1, 2)
        bits = c.contiguous().view(torch.uint8 if cache.element_size() == 1 else torch.int16)
        return bits.reshape(-1, self.c["h"], cache.shape[-1])

    def rows(self, cache):
        """The cache rows of the tokens' slots, [T, H, D]."""
        return self._slot_rows(cache)[self.slots].view(cache.dtype)

    def other_rows_nonzero(self, cache):
        """Elements of rows no token names that are not zero (the caches start zeroed)."""
        bits = self._slot_rows(cache)
        mask = torch.ones(bits.shape[0], dtype=torch.bool, device=bits.device)
        mask[self.slots] = False
        return int((bits[mask] != 0).sum().item())


# --- FlashInfer and kvrope ------------------------------------------------------------------------------

class FlashInfer:
    """FlashInfer's rope, page and Cake modules, imported under stub packages (the module docstring)."""

    def __init__(self):
        self.error = None
        self.rope = self.page = self.cake = self.cake_jit = None
        loaded = sys.modules.get("flashinfer")  # (a FlashInfer made before left its stub, whose __spec__ is None:
        if loaded is not None and getattr(loaded, "__path__", None):  # find_spec would raise ValueError on it)
            root = list(loaded.__path__)[0]
        else:
            spec = importlib.util.find_spec("flashinfer")
            if spec is None or not spec.submodule_search_locations:
                self.error = "flashinfer is not importable (source dev/scripts/flashinfer_setup.sh first)"
                return
            root = list(spec.submodule_search_locations)[0]
        for name, path in (("flashinfer", root), ("flashinfer.jit", os.path.join(root, "jit")),
                           ("flashinfer.quantization", os.path.join(root, "quantization"))):
            if name not in sys.modules:
                stub = types.ModuleType(name)
                stub.__path__ = [path]
                stub.__package__ = name
                sys.modules[name] = stub
        try:
            importlib.import_module("pynvml")
        except ImportError:  # flashinfer.utils imports it; the modules used here never call it
            sys.modules["pynvml"] = _pynvml_stub()
        try:
            self.rope = importlib.import_module("flashinfer.rope")
            self.page = importlib.import_module("flashinfer.page")
        except Exception as e:  # noqa: BLE001 (any import failure: report it, time the rest)
            self.error = f"flashinfer.rope / flashinfer.page: {type(e).__name__}: {e}"
            return
        try:
            self.cake = importlib.import_module("flashinfer.cake_fused_qk_rope_append")
            self.cake_jit = importlib.import_module("flashinfer.cake_fused_qk_rope_append_backend.cake_jit")
            self.cake_build = importlib.import_module("flashinfer.cake_fused_qk_rope_append_backend.cake_build")
        except Exception as e:  # noqa: BLE001
            print(f"flashinfer: the Cake fused kernel is unavailable: {type(e).__name__}: {e}")
            self.cake = None

    NVFP4_OP_PARAMS = ("append_key", "append_value", "slot_mapping", "paged_k_cache", "paged_v_cache",
                       "k_scale_cache", "v_scale_cache", "k_scale", "v_scale", "layout")

    def nvfp4_append(self):
        """FlashInfer's NVFP4 append by slot as the timed pair calls it: (call(k, v, slots, kc, vc, ksf, vsf,
        k_scale, v_scale, layout), note), k_scale and v_scale float32 device tensors of one element. Its custom op
        _nvfp4_quantize_append_paged_kv_cache_with_slot_mapping_kernel where found with the parameters of 0.7.4
        (what the public function launches once it has validated the scales, which costs a host copy a call);
        else the public function (note says so); (None, why) where neither exists."""
        if self.page is None:
            return None, "flashinfer.page is not importable"
        public = getattr(self.page, "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", None)
        op = getattr(self.page, "_nvfp4_quantize_append_paged_kv_cache_with_slot_mapping_kernel", None)
        layouts = getattr(self.page, "TensorLayout", None)
        if op is not None and layouts is not None:
            try:
                params = tuple(inspect.signature(getattr(op, "_init_fn", op)).parameters)
            except (TypeError, ValueError):
                params = ()
            if params == self.NVFP4_OP_PARAMS:
                return (lambda k, v, slots, kc, vc, ksf, vsf, ks, vs, layout:
                        op(k, v, slots, kc, vc, ksf, vsf, ks, vs, layouts[layout].value)), "its custom op"
        if public is None:
            return None, "flashinfer.page has no nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"
        return (lambda k, v, slots, kc, vc, ksf, vsf, ks, vs, layout:
                public(k, v, slots, (kc, vc), (ksf, vsf), ks, vs, kv_layout=layout)), \
            "the public function (its custom op not found: the span includes its check of the scales)"

    def nvfp4_reference(self):
        """The public NVFP4 append by slot (what verify() compares the caches with), or None."""
        return None if self.page is None else getattr(self.page,
                                                      "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", None)

    def cake_supports(self, c):
        return (self.cake is not None and c["cache"] == "bf16" and c["layout"] == "NHD" and c["d"] == 128
                and (c["hq"], c["h"]) in tuple(self.cake_jit.SUPPORTED_HEADS))

    def prebuild(self, cases):
        """Every JIT module the cases need, in one parallel ninja build (else each builds at its first call)."""
        from flashinfer.jit.core import build_jit_specs
        from flashinfer.jit.page import gen_page_module
        from flashinfer.jit.rope import gen_rope_module
        specs = {"rope": gen_rope_module(), "page": gen_page_module()}
        if self.cake is not None:
            arch, sms = self.cake_jit.device_arch(0), self.cake_jit.sm_count(0)
            for c in cases:
                if self.cake_supports(c):
                    rows = c.get("rows", c["seqs"] * c["tokens_per_seq"])
                    stage = self.cake_jit.stage_for(c["hq"], c["h"], arch=arch, num_rows=rows, num_requests=c["seqs"],
                                                    page_size=c["page_size"], num_sms=sms, qk_norm_policy=0,
                                                    enable_pdl=False)
                    lib = self.cake_jit.library_name(stage, arch)
                    if lib not in specs:
                        specs[lib] = self.cake_build.jit_spec(lib)
        start = time.perf_counter()
        build_jit_specs(list(specs.values()), verbose=False)
        print(f"flashinfer: JIT modules ready ({len(specs)}: {', '.join(specs)}) in "
              f"{time.perf_counter() - start:.0f} s")


def _pynvml_stub():
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    m.NVMLError = NVMLError
    m.NVMLError_NotSupported = type("NVMLError_NotSupported", (NVMLError,), {})

    def unavailable(*args, **kwargs):
        raise NVMLError("pynvml is not installed")

    m.__getattr__ = lambda name: unavailable
    return m


def import_kvrope():
    try:
        kvrope_torch = importlib.import_module("kvrope_torch")
    except Exception as e:  # noqa: BLE001
        return None, f"kvrope_torch is not importable ({type(e).__name__}: {e})"
    if not hasattr(kvrope_torch, "rope_append_"):
        return None, "kvrope_torch has no rope_append_"
    return kvrope_torch, None


def kvrope_takes(kv, name):
    """Whether the package's rope_append_ takes keyword `name` (key_cache_sf: NVFP4 caches; mrope_section)."""
    try:
        return kv is not None and name in inspect.signature(kv.rope_append_).parameters
    except (TypeError, ValueError):
        return False


def kvrope_writes_q8(kv):
    """Whether the package's rope_append_ writes q in fp8 (an fp8 query_out with q_scale): the q-fp8 cases'
    kvrope columns; else left out on those cases."""
    try:
        return kv is not None and "q_scale" in inspect.signature(kv.rope_append_).parameters
    except (TypeError, ValueError):
        return False


MLA_KWARGS = ("query_nope", "query_out", "kv_scale", "q_scale", "style")


def kvrope_mla(kv):
    """The package's MLA append, kvrope_torch.mla_append_(query_pe, kv_c, k_pe, positions, cos_sin_cache,
    latent_cache, slot_mapping, *, query_nope, query_out, kv_scale, q_scale, style, ...), as (function, None), or
    (None, why) where the package lacks it or one of those keywords (the MLA cases' kvrope column is then left
    out)."""
    f = getattr(kv, "mla_append_", None) if kv is not None else None
    if f is None:
        return None, "kvrope_torch has no mla_append_"
    try:
        params = inspect.signature(f).parameters
    except (TypeError, ValueError):
        return f, None
    missing = [name for name in MLA_KWARGS if name not in params]
    return (None, f"kvrope_torch.mla_append_ takes no {', '.join(missing)}") if missing else (f, None)


def mla_methods(pr, fi, kv):
    """An MLA case's calls, as methods gives them (callable, where q goes, whether k_pe is rotated in place, the
    fp8 scales (kv_c, k_pe, q)); every one writes the one cache [pages, P, L + R] (FlashInfer's ckv and kpe:
    views of it; its kernels take the strides):
    - bf16: FlashInfer's pair (column FI r+a) apply_rope_with_cos_sin_cache_inplace (q_pe and k_pe in place,
      interleaved) then append_paged_mla_kv_cache (kv_c and the rotated k_pe);
    - q-fp8: its fused rope_quantize_fp8_append_paged_kv_cache in MLA mode (column FI fp8: k_rope 2-D, v None,
      paged_kv_cache (ckv, kpe)), q_rope_out and q_nope_out views of out_q8, scales 1 / the cases' (it
      multiplies, kvrope divides);
    - kvrope: mla_append_ (q_pe in place; q-fp8: query_nope and query_out = out_q8, kv_scale, q_scale)."""
    c = pr.c
    q_nope, q_pe, kv_c, k_pe = pr.mla_views()
    n, r = c["nope"], c["d"]
    scales = (MLA_KV_SCALE, MLA_KV_SCALE, QUERY_SCALE)
    out = {}
    if fi.rope is not None and fi.page is not None:
        if c["q8"]:
            fused8 = fi.rope.rope_quantize_fp8_append_paged_kv_cache
            out["fi_fp8"] = (lambda: fused8(q_pe, k_pe, q_nope, kv_c, None, pr.table, pr.positions, (pr.ckv, pr.kpe),
                                            pr.kv_indices, pr.kv_indptr, pr.batch_indices, pr.positions32,
                                            is_neox=False, quantize_dtype=FP8, quant_scale_q=1.0 / QUERY_SCALE,
                                            quant_scale_kv=1.0 / MLA_KV_SCALE, page_size=c["page_size"],
                                            q_rope_out=pr.out_q8[..., n:], q_nope_out=pr.out_q8[..., :n]),
                             "out_q8", False, scales)
        else:
            rope_inplace = fi.rope.apply_rope_with_cos_sin_cache_inplace
            append = fi.page.append_paged_mla_kv_cache

            def two_launches():
                rope_inplace(pr.positions, q_pe, k_pe, r, pr.table, is_neox=False)
                append(kv_c, k_pe, pr.batch_indices, pr.positions32, pr.ckv, pr.kpe, pr.kv_indices, pr.kv_indptr,
                       pr.kv_last_page_len)

            out["fi_two"] = (two_launches, "q", True, None)
    mla_append, _ = kvrope_mla(kv)
    if mla_append is not None:
        extra = dict(query_nope=q_nope, query_out=pr.out_q8, kv_scale=pr.kv_scale, q_scale=pr.q_scale) \
            if c["q8"] else {}
        out["kvrope"] = (lambda: mla_append(q_pe, kv_c, k_pe, pr.positions, pr.table, pr.cache, pr.slots,
                                            style="interleaved", **extra),
                         "out_q8" if c["q8"] else "q", False, scales)
    return out


def methods(pr, fi, kv):
    """The calls that apply to a case, by name: (callable, where q goes, whether k is rotated in place,
    the fp8 scales (k, v, q) the cache rows and an fp8 q get). MLA cases: mla_methods."""
    c = pr.c
    if c.get("mla"):
        return mla_methods(pr, fi, kv)
    q, k, v = pr.views()
    hq, h, d, layout = c["hq"], c["h"], c["d"], c["layout"]
    fp8 = c["cache"] == "fp8_e4m3"
    q8 = bool(c.get("q8"))
    out = {}
    if c["cache"] == "nvfp4":  # FlashInfer's rope + NVFP4 append pair; kvrope with kv_cache_dtype="nvfp4"
        append, _ = fi.nvfp4_append() if fi.rope is not None else (None, None)
        if append is not None:
            rope_inplace = fi.rope.apply_rope_with_cos_sin_cache_inplace

            def rope_nvfp4():
                rope_inplace(pr.positions, q, k, d, pr.table, is_neox=True)
                append(k, v, pr.slots, pr.kc, pr.vc, pr.ksf, pr.vsf, pr.k_scale, pr.v_scale, layout)

            out["fi_nvfp4"] = (rope_nvfp4, "q", True, None)
        if kvrope_takes(kv, "key_cache_sf"):
            for name, kip in (("kvrope", False), ("kvrope_kip", True)):
                out[name] = (lambda kip=kip: kv.rope_append_(q, k, v, pr.positions, pr.table, pr.kc, pr.vc, pr.slots,
                                                             key_in_place=kip, layout=layout, kv_cache_dtype="nvfp4",
                                                             k_scale=pr.k_scale, v_scale=pr.v_scale,
                                                             key_cache_sf=pr.ksf, value_cache_sf=pr.vsf),
                             "q", kip, None)
        return out
    if c.get("mrope"):  # FlashInfer has no mRoPE kernel: kvrope only
        if kvrope_takes(kv, "mrope_section"):
            for name, kip in (("kvrope", False), ("kvrope_kip", True)):
                out[name] = (lambda kip=kip: kv.rope_append_(q, k, v, pr.positions3, pr.table, pr.kc, pr.vc, pr.slots,
                                                             key_in_place=kip, layout=layout,
                                                             mrope_section=pr.sections),
                             "q", kip, None)
        return out
    if fi.rope is not None:
        if fi.cake_supports(c):
            cake = fi.cake.cake_fused_qk_rmsnorm_rope_append_paged_kv_cache
            out["fi_fused"] = (lambda: cake(pr.qkv, pr.table, pr.seq_lens, pr.q_indptr, pr.page_indices, pr.kc, pr.vc,
                                            num_q_heads=hq, num_kv_heads=h, out_q=pr.out_q,
                                            clear_unused_last_page_rows=False),
                               "out_q", False, None)
        if fp8:
            # FlashInfer multiplies by its scales (one for k and v); the q-fp8 cases' q scale is the cases'
            # (kvrope's work), the fp8-cache cases' 1 (as timed before the q-fp8 cases existed).
            fused8 = fi.rope.rope_quantize_fp8_append_paged_kv_cache
            q_scale = QUERY_SCALE if q8 else 1.0
            out["fi_fp8"] = (lambda: fused8(q, k, None, None, v, pr.table, pr.positions, (pr.kc, pr.vc), pr.kv_indices,
                                            pr.kv_indptr, pr.batch_indices, pr.positions32, is_neox=True,
                                            quantize_dtype=FP8, quant_scale_q=1.0 / q_scale,
                                            quant_scale_kv=1.0 / KEY_SCALE, page_size=c["page_size"],
                                            kv_layout=layout, q_rope_out=pr.out_q8),
                             "out_q8", False, (KEY_SCALE, KEY_SCALE, q_scale))
        else:
            rope_inplace = fi.rope.apply_rope_with_cos_sin_cache_inplace
            append = fi.page.append_paged_kv_cache

            def two_launches():
                rope_inplace(pr.positions, q, k, d, pr.table, is_neox=True)
                append(k, v, pr.batch_indices, pr.positions32, (pr.kc, pr.vc), pr.kv_indices, pr.kv_indptr,
                       pr.kv_last_page_len, kv_layout=layout)

            out["fi_two"] = (two_launches, "q", True, None)
    if kv is not None and (not q8 or kvrope_writes_q8(kv)):
        scales = dict(k_scale=pr.k_scale, v_scale=pr.v_scale) if fp8 else {}
        if q8:  # q to an fp8 query_out, q left as it was
            scales.update(query_out=pr.out_q8, q_scale=pr.q_scale)
        for name, kip in (("kvrope", False), ("kvrope_kip", True)):
            out[name] = (lambda kip=kip: kv.rope_append_(q, k, v, pr.positions, pr.table, pr.kc, pr.vc, pr.slots,
                                                         key_in_place=kip, layout=layout, **scales),
                         "out_q8" if q8 else "q", kip, (KEY_SCALE, VALUE_SCALE, QUERY_SCALE))
    return out


# --- the check --------------------------------------------------------------------------------------------

def rope_ref(x, table, positions, sections=None):
    """RoPE of x [T, n, D] (rotate-half) in fp32 from the table cache rows of positions [T]; with mRoPE
    sections [s0, s1, s2], positions [3, T] and pair i from the row of its stream (contiguous sections)."""
    half = x.shape[-1] // 2
    if sections is None:
        cs = table[positions]
    else:
        bounds = [0, sections[0], sections[0] + sections[1], half]
        rows = [table[positions[j]] for j in range(3)]
        cos = torch.cat([rows[j][:, bounds[j]:bounds[j + 1]] for j in range(3)], dim=1)
        sin = torch.cat([rows[j][:, half + bounds[j]:half + bounds[j + 1]] for j in range(3)], dim=1)
        cs = torch.cat([cos, sin], dim=1)
    c, s = cs[:, None, :half], cs[:, None, half:]
    x = x.float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rope_ref_interleaved(x, table, positions):
    """RoPE of x [T, n, R] or [T, R] with interleaved pairs (2i, 2i + 1) (DeepSeek's), in fp32 from the table cache
    rows of positions [T] (cos | sin, pair i at column i)."""
    half = x.shape[-1] // 2
    cs = table[positions]
    c, s = cs[:, :half], cs[:, half:]
    if x.dim() == 3:
        c, s = c[:, None], s[:, None]
    x = x.float()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)


def to_fp8(x, scale):
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def steps(got, want):
    """The largest distance between got and want in units in the last place of want's format (bf16: 7
    mantissa bits, e4m3: 3, subnormals included); inf where one is NaN."""
    mbits, emin = (7, -125) if want.dtype == torch.bfloat16 else (3, -5)
    g, w = got.float(), want.float()
    if g.numel() == 0:
        return 0.0
    _, e = torch.frexp(w)
    ulp = torch.exp2((e.clamp(min=emin) - 1 - mbits).float())
    d = (g - w).abs() / ulp
    d[g.isnan() ^ w.isnan()] = math.inf
    d[g.isnan() & w.isnan()] = 0
    return float(d.max().item())


VERIFY_STARTS, VERIFY_LENGTHS, VERIFY_SMAX = [0, 37, 100], [5, 1, 20], 256


def verify_case(cache, layout, q8=False, mrope=False):
    """The check's small ragged batch: 3 sequences (5 tokens from 0, 1 at 37, 20 from 100), Hq = 64, H = 8."""
    return dict(decode=False, seqs=len(VERIFY_LENGTHS), tokens_per_seq=0, rows=sum(VERIFY_LENGTHS),
                s_max=VERIFY_SMAX, hq=64, h=8, d=128, page_size=16, max_position=S_MAX, cache=cache, layout=layout,
                q8=q8, mrope=mrope, twin=0)


def verify(fi, kv):
    """Every method on verify_case's batch, every cache type and layout, against rope_ref: outputs within one
    unit in the last place of their format, rows no token names untouched. Returns the number of
    disagreements."""
    seqs, starts, lengths, p, s_max = len(VERIFY_LENGTHS), VERIFY_STARTS, VERIFY_LENGTHS, 16, VERIFY_SMAX
    rng = SplitMix(7)
    pages = seqs * (s_max // p)
    perm = list(range(pages))
    for i in range(pages - 1, 0, -1):
        j = rng.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    page_table = [perm[b * (s_max // p):(b + 1) * (s_max // p)] for b in range(seqs)]
    positions = [s + i for s, n in zip(starts, lengths) for i in range(n)]
    batch = [b for b in range(seqs) for _ in range(lengths[b])]
    slots = [page_table[b][pos // p] * p + pos % p for b, pos in zip(batch, positions)]
    table = rope_table(S_MAX, 128)
    tokens = (page_table, positions, slots, starts, lengths)
    failures = 0
    for cache, q8, mrope in (("bf16", False, False), ("fp8_e4m3", False, False), ("fp8_e4m3", True, False),
                             ("bf16", False, True)):
        for layout in ("NHD", "HND"):
            c = verify_case(cache, layout, q8, mrope)
            probe = Problem(c, tokens, table, zero_caches=True, seed=3)
            for name in methods(probe, fi, kv):
                pr = Problem(c, tokens, table, zero_caches=True, seed=3)
                call, q_where, kip, scales = methods(pr, fi, kv)[name]
                q0, k0, v0 = (x.clone() for x in pr.views())
                where = pr.positions3 if mrope else pr.positions
                q_ref, k_ref = rope_ref(q0, table, where, pr.sections), rope_ref(k0, table, where, pr.sections)
                try:
                    call()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"verify {name:10s} {cache_label(c):8s} {layout}: FAILED to run: {type(e).__name__}: {e}")
                    failures += 1
                    continue
                q, k, v = pr.views()
                got_q = {"out_q": pr.out_q, "out_q8": pr.out_q8, "q": q}[q_where]
                # An fp8 q: RoPE(q) in fp32 quantized with the method's q scale (kvrope rounds to bf16 first,
                # FlashInfer multiplies by 1 / scale: either within the one step allowed).
                want_q = to_fp8(q_ref, scales[2]) if q_where == "out_q8" else q_ref.bfloat16()
                k_bf = k_ref.bfloat16()
                if cache == "bf16":
                    want_k, want_v = k_bf, v0
                else:
                    want_k, want_v = to_fp8(k_bf, scales[0]), to_fp8(v0, scales[1])
                found = {"q": steps(got_q, want_q), "k": steps(k, k_bf if kip else k0), "v": steps(v, v0),
                         "key rows": steps(pr.rows(pr.kc), want_k), "value rows": steps(pr.rows(pr.vc), want_v)}
                if q8:  # q written to an fp8 output only: q itself as it was
                    found["q in"] = steps(q, q0)
                limit = {"k": 1 if kip else 0, "v": 0, "q in": 0}
                bad = [f"{key} {val:g}" for key, val in found.items() if val > limit.get(key, 1)]
                stray = pr.other_rows_nonzero(pr.kc) + pr.other_rows_nonzero(pr.vc)
                if stray:
                    bad.append(f"{stray} elements written outside the tokens' rows")
                failures += bool(bad)
                detail = ", ".join(f"{key} {val:g}" for key, val in found.items())
                verdict = "MISMATCH " + "; ".join(bad) if bad else "ok"
                print(f"verify {name:10s} {cache_label(c):8s} {layout}: {verdict} (ulps: {detail})")
                del pr
            del probe
    return failures + verify_nvfp4(fi, kv, tokens, table) + verify_mla(fi, kv, tokens)


def verify_nvfp4(fi, kv, tokens, table):
    """The NVFP4 methods on verify_case's batch, each layout: q (and k where rotated in place) within one unit
    in the last place of rope_ref, v and (k read only) k unchanged; the caches (codes and block scales, the whole
    tensors: rows no token names stay zero) bit for bit what FlashInfer's public quantizer writes, into zeroed
    caches, from the rotated k the method wrote (kvrope, k read only: kvrope's key_in_place call's, the same
    arithmetic) and v; and FlashInfer's pair's value codes and scales bit for bit kvrope's. Returns the number
    of disagreements."""
    reference = fi.nvfp4_reference()
    failures = 0
    for layout in ("NHD", "HND"):
        c = verify_case("nvfp4", layout)
        names = list(methods(Problem(c, tokens, table, zero_caches=True, seed=3), fi, kv))
        if not names:
            continue
        results = {}
        for name in sorted(names, key=lambda n: n != "kvrope_kip"):  # kvrope_kip first: its k stands for kvrope's
            pr = Problem(c, tokens, table, zero_caches=True, seed=3)
            call, _, kip, _ = methods(pr, fi, kv)[name]
            q0, k0, v0 = (x.clone() for x in pr.views())
            q_ref, k_ref = rope_ref(q0, table, pr.positions), rope_ref(k0, table, pr.positions)
            try:
                call()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"verify {name:10s} {'nvfp4':8s} {layout}: FAILED to run: {type(e).__name__}: {e}")
                failures += 1
                continue
            q, k, v = pr.views()
            found = {"q": steps(q, q_ref.bfloat16()), "k": steps(k, k_ref.bfloat16() if kip else k0),
                     "v": steps(v, v0)}
            bad = [f"{key} {val:g}" for key, val in found.items() if val > {"k": 1 if kip else 0, "v": 0}.get(key, 1)]
            results[name] = (pr, k.clone() if kip else None)
            k_seen = results[name][1] if kip else results.get("kvrope_kip", (None, None))[1]
            compared = "not compared (no FlashInfer quantizer)" if reference is None else \
                "not compared (no rotated k: kvrope_kip did not run)"
            if reference is not None and k_seen is not None:
                ref = Problem(c, tokens, table, zero_caches=True, seed=3)
                reference(k_seen, v0, ref.slots, (ref.kc, ref.vc), (ref.ksf, ref.vsf), KEY_SCALE, VALUE_SCALE,
                          kv_layout=layout)
                torch.cuda.synchronize()
                differ = {label: int((got.view(torch.uint8) != want.view(torch.uint8)).sum().item())
                          for label, got, want in (("key codes", pr.kc, ref.kc), ("value codes", pr.vc, ref.vc),
                                                   ("key scales", pr.ksf, ref.ksf),
                                                   ("value scales", pr.vsf, ref.vsf))}
                bad += [f"{label}: {n} bytes differ from FlashInfer's quantizer" for label, n in differ.items() if n]
                compared = "caches bit-exact with FlashInfer's quantizer" if not any(differ.values()) else \
                    "caches differ"
                del ref
            failures += bool(bad)
            detail = ", ".join(f"{key} {val:g}" for key, val in found.items())
            verdict = "MISMATCH " + "; ".join(bad) if bad else "ok"
            print(f"verify {name:10s} {'nvfp4':8s} {layout}: {verdict} ({compared}; ulps: {detail})")
        # The FlashInfer pair against kvrope: v's codes and scales bit for bit (both quantize v as given); k's
        # as they compare (the two rotations may round an element of k apart).
        if "fi_nvfp4" in results and "kvrope" in results:
            a, b = results["fi_nvfp4"][0], results["kvrope"][0]
            differ = {label: int((x.view(torch.uint8) != y.view(torch.uint8)).sum().item())
                      for label, x, y in (("value codes", a.vc, b.vc), ("value scales", a.vsf, b.vsf),
                                          ("key codes", a.kc, b.kc), ("key scales", a.ksf, b.ksf))}
            k_apart = int((results["fi_nvfp4"][1].view(torch.int16) != results["kvrope_kip"][1].view(torch.int16))
                          .sum().item()) if "kvrope_kip" in results else -1
            bad = differ["value codes"] + differ["value scales"]
            failures += bool(bad)
            print(f"verify fi_nvfp4 vs kvrope nvfp4 {layout}: {'MISMATCH' if bad else 'ok'} (bytes differing: " +
                  ", ".join(f"{label} {n}" for label, n in differ.items()) +
                  (f"; rotated k elements differing (FlashInfer's rope vs kvrope's): {k_apart}" if k_apart >= 0 else "")
                  + ")")
        del results
    return failures


def verify_mla_case(cache, hq):
    """The check's small ragged batch (verify_case's tokens) as an MLA case: Hq 16 or 128, L 512, R 64."""
    q8 = cache != "bf16"
    return dict(decode=False, seqs=len(VERIFY_LENGTHS), tokens_per_seq=0, rows=sum(VERIFY_LENGTHS),
                s_max=VERIFY_SMAX, hq=hq, h=1, d=MLA_ROTARY, page_size=16, max_position=S_MAX, cache=cache,
                layout="L+R", q8=q8, mrope=False, twin=0, mla=True, latent=MLA_LATENT,
                nope=MLA_NOPE_FP8 if q8 else MLA_NOPE)


def verify_mla(fi, kv, tokens):
    """The MLA methods on verify_case's batch, bf16 and q-fp8, Hq 16 and 128, into zeroed caches, against
    rope_ref_interleaved: RoPE(q_pe) (bf16 in place; fp8: the code of RoPE(q_pe) / 0.02) and RoPE(k_pe) rows within
    one unit in the last place of their format; kv_c's rows a copy (fp8: within one code of kv_c / 0.015); q_nope
    (fp8: its code) likewise; q (q-fp8), kv_c and k_pe (where not rotated in place) unchanged; rows no token names
    still zero. Then FlashInfer's method against kvrope's on the same inputs: the bytes of the cache (latent and
    rope parts) and of q's output that differ, and by how much (bf16 kv_c rows must be bit for bit; the fp8 codes
    may differ by one step where x * (1 / scale) and x / scale, or RoPE(q_pe) in fp32 and rounded to bf16 first,
    fall on either side of a rounding boundary). Returns the number of disagreements."""
    table = rope_table(S_MAX, MLA_ROTARY)
    failures = 0
    for cache in ("bf16", "fp8_e4m3"):
        for hq in MLA_QUERY_HEADS:
            c = verify_mla_case(cache, hq)
            names = list(methods(Problem(c, tokens, table, zero_caches=True, seed=3), fi, kv))
            results = {}
            for name in names:
                pr = Problem(c, tokens, table, zero_caches=True, seed=3)
                call, q_where, kip, scales = methods(pr, fi, kv)[name]
                q_nope0, q_pe0, kv_c0, k_pe0 = (x.clone() for x in pr.mla_views())
                q_ref = rope_ref_interleaved(q_pe0, table, pr.positions)
                k_ref = rope_ref_interleaved(k_pe0, table, pr.positions).bfloat16()
                try:
                    call()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"verify {name:10s} {cache_label(c):10s} Hq {hq}: FAILED to run: {type(e).__name__}: {e}")
                    failures += 1
                    continue
                q_nope, q_pe, kv_c, k_pe = pr.mla_views()
                rows, lat = pr.mla_rows(), c["latent"]
                if c["q8"]:
                    want_q = torch.cat([to_fp8(q_nope0, scales[2]), to_fp8(q_ref, scales[2])], dim=-1)
                    found = {"q out": steps(pr.out_q8, want_q), "q in": steps(pr.q, torch.cat([q_nope0, q_pe0], -1))}
                    want_rows = torch.cat([to_fp8(kv_c0, scales[0]), to_fp8(k_ref, scales[1])], dim=-1)
                else:
                    found = {"q_pe": steps(q_pe, q_ref.bfloat16()), "q_nope": steps(q_nope, q_nope0)}
                    want_rows = torch.cat([kv_c0, k_ref], dim=-1)
                found.update({"kv_c": steps(kv_c, kv_c0), "k_pe": steps(k_pe, k_ref if kip else k_pe0),
                              "latent rows": steps(rows[:, :lat], want_rows[:, :lat]),
                              "rope rows": steps(rows[:, lat:], want_rows[:, lat:])})
                limit = {"q in": 0, "q_nope": 0, "kv_c": 0, "k_pe": 1 if kip else 0,
                         "latent rows": 1 if c["q8"] else 0}
                bad = [f"{key} {val:g}" for key, val in found.items() if val > limit.get(key, 1)]
                stray = pr.mla_other_rows_nonzero()
                if stray:
                    bad.append(f"{stray} elements written outside the tokens' rows")
                failures += bool(bad)
                detail = ", ".join(f"{key} {val:g}" for key, val in found.items())
                verdict = "MISMATCH " + "; ".join(bad) if bad else "ok"
                print(f"verify {name:10s} {cache_label(c):10s} Hq {hq}: {verdict} (ulps: {detail})")
                results[name] = pr
            # FlashInfer's method against kvrope's, output by output.
            fi_name = "fi_fp8" if c["q8"] else "fi_two"
            if fi_name in results and "kvrope" in results:
                a, b, lat = results[fi_name], results["kvrope"], c["latent"]
                ra, rb = a.mla_rows(), b.mla_rows()
                parts = {"latent rows": (ra[:, :lat], rb[:, :lat]), "rope rows": (ra[:, lat:], rb[:, lat:])}
                if c["q8"]:
                    parts["q out"] = (a.out_q8, b.out_q8)
                else:
                    parts["q_pe"] = (a.mla_views()[1], b.mla_views()[1])
                differ = {}
                for label, (x, y) in parts.items():
                    bits = torch.uint8 if x.element_size() == 1 else torch.int16
                    n = int((x.contiguous().view(bits) != y.contiguous().view(bits)).sum().item())
                    differ[label] = (n, steps(x, y), x.numel())
                exact = {"latent rows"} if not c["q8"] else set()  # bf16 kv_c: copies, bit for bit
                bad = [f"{label}: {n} of {total} differ, by up to {st:g} steps"
                       for label, (n, st, total) in differ.items() if st > (0 if label in exact else 1)]
                failures += bool(bad)
                detail = ", ".join(f"{label} {n} of {total} (max {st:g} steps)"
                                   for label, (n, st, total) in differ.items())
                verdict = "MISMATCH " + "; ".join(bad) if bad else "ok"
                print(f"verify {fi_name} vs kvrope {cache_label(c)} Hq {hq}: {verdict} (elements differing: {detail})")
            del results
    return failures


# --- the clock --------------------------------------------------------------------------------------------

class SpanClock:
    """bench/torch_compare.py's span clock: before each call an L2 flush (a write of twice the L2) and a
    synchronize; after it a marker kernel; a call's time is the span of the kernels between the two, from
    torch.profiler's CUDA activity (CUPTI)."""

    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush_buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
        self.flush_names = self._kernel_names(self.flush)
        self.marker_names = self._kernel_names(self.mark)

    def flush(self):
        self.flush_buf.random_()

    @staticmethod
    def mark():
        torch.cuda._sleep(1)

    @staticmethod
    def _kernel_names(fn):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}

    def span(self, call, iters, warmup=3):
        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                self.flush()
                torch.cuda.synchronize()
                call()
                self.mark()
                torch.cuda.synchronize()
        kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                         if e.device_type == torch.autograd.DeviceType.CUDA)
        spans, current = [], None
        for start, end, name in kernels:
            if name in self.flush_names:
                current = []
            elif name in self.marker_names:
                if current:
                    spans.append(max(e for _, e in current) - min(s for s, _ in current))
                current = None
            elif current is not None:
                current.append((start, end))
        return statistics.median(spans) if spans else float("nan")


# --- main -------------------------------------------------------------------------------------------------

COLUMNS = ("fi_fused", "fi_fp8", "fi_two", "fi_nvfp4", "kvrope", "kvrope_kip")
FI_COLUMNS = 4  # COLUMNS[:4] are FlashInfer's


def fmt(x, f="{:.2f}"):
    return f.format(x) if x is not None and math.isfinite(x) else "-"


def geomean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan"), len(xs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", default="serve-decode,serve-prefill")
    parser.add_argument("--decode-cases", default="", help="ids or ranges A-B of serve-decode (default: all)")
    parser.add_argument("--prefill-cases", default="", help="ids or ranges A-B of serve-prefill (default: all)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--seed", type=int, default=20261129, help="kvrope_bench's --seed")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--no-kvrope", action="store_true", help="FlashInfer only")
    parser.add_argument("--build-only", action="store_true", help="build FlashInfer's JIT modules and exit")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # a run cut short by a timeout keeps every finished line

    cases = []
    for suite in args.suites.split(","):
        if suite not in ("serve-decode", "serve-prefill"):
            parser.error(f"unknown suite {suite!r}")
        decode = suite == "serve-decode"
        ids = args.decode_cases if decode else args.prefill_cases
        keep = set()  # (ids, or ranges A-B, as kvrope_bench's --cases)
        for part in filter(None, ids.split(",")):
            first, _, last = part.partition("-")
            keep.update(range(int(first), int(last or first) + 1))
        keep = keep or None
        cases += [dict(c, suite=suite) for c in case_table(decode) if keep is None or c["id"] in keep]

    fi = FlashInfer()
    if fi.error:
        print(f"flashinfer: {fi.error}")
    else:
        try:
            fi.prebuild(cases + ([] if args.no_verify else [verify_case("bf16", "NHD")]))
        except Exception as e:  # noqa: BLE001 (each module then builds at its first call)
            print(f"flashinfer: parallel JIT build failed ({type(e).__name__}: {e}); building at first use")
    if args.build_only:
        return 1 if fi.error else 0
    kv, why = (None, "--no-kvrope") if args.no_kvrope else import_kvrope()
    if why:
        print(f"kvrope: columns left out: {why}")
    elif not kvrope_writes_q8(kv) and any(c["q8"] and group(c) == "base" for c in cases):
        print("kvrope: columns left out on the q-fp8 cases: kvrope_torch.rope_append_ takes no q_scale (no fp8 "
              "query_out); kvrope_bench times them")
    for kw, what in (("key_cache_sf", "NVFP4"), ("mrope_section", "mRoPE")):
        if kv is not None and not kvrope_takes(kv, kw) and any(group(c) == what.lower() for c in cases):
            print(f"kvrope: columns left out on the {what} cases: kvrope_torch.rope_append_ takes no {kw}")
    if any(group(c) == "nvfp4" for c in cases) and fi.rope is not None:
        append, how = fi.nvfp4_append()
        print(f"flashinfer: NVFP4 pair (FI r+fp4): "
              f"{'not timed: ' + how if append is None else 'append through ' + how}")
    if any(group(c) == "mrope" for c in cases):
        print("flashinfer: no mRoPE kernel: its columns are empty on the mRoPE cases (cache bf16+mrope)")
    if any(group(c) == "mla" for c in cases):
        _, why_mla = kvrope_mla(kv)
        if kv is not None and why_mla:
            print(f"kvrope: columns left out on the MLA cases: {why_mla} (the MLA op of python/; kvrope_bench "
                  "times them)")
        print("flashinfer: MLA cases (cache mla_bf16, mla_fp8+q8; L 512, R 64, interleaved; every method writes one "
              "cache [pages, P, L + R], FlashInfer's ckv and kpe views of it): FI r+a = "
              "apply_rope_with_cos_sin_cache_inplace (q_pe and k_pe in place) + append_paged_mla_kv_cache; FI fp8 = "
              "rope_quantize_fp8_append_paged_kv_cache in MLA mode (q_nope and RoPE(q_pe) to fp8, q [T, Hq, 512 + "
              "64]); kvrope = mla_append_ (q_pe in place; or query_out fp8 with query_nope)")
    if fi.rope is None and kv is None:
        print("nothing to time")
        return 1

    dev = torch.cuda.get_device_name(0)
    print(f"flashinfer_compare: {dev}, torch {torch.__version__} (CUDA {torch.version.cuda}), median of {args.iters} "
          f"calls, L2 flushed before each; CUPTI kernel span (first start to last end) in us")
    failures = 0
    if not args.no_verify:
        failures = verify(fi, kv)
        print(f"verify: {'all methods agree with the reference' if failures == 0 else f'{failures} MISMATCH(ES)'}")

    clock = SpanClock()
    # Each case's row as soon as it is timed (a run cut short keeps what it printed), the means at the end.
    print("\nFI fused: cake_fused_qk_rmsnorm_rope_append_paged_kv_cache (bf16 NHD, Hq 64); FI fp8: "
          "rope_quantize_fp8_append_paged_kv_cache (q out in fp8); FI r+a: apply_rope_with_cos_sin_cache_inplace + "
          "append_paged_kv_cache (k in place); FI r+fp4: apply_rope_with_cos_sin_cache_inplace + "
          "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping (NVFP4 caches, k in place); kvrope: rope_append_ "
          "(k read only); kip: with key_in_place; FI1: the faster FlashInfer single launch; FI2: FI r+a, or FI "
          "r+fp4 on the NVFP4 cases")
    print(f"{'suite':13s} {'case':>4s} {'shape':>8s} {'Hq':>3s} {'cache':>8s} {'lay':>3s} {'MB':>8s} | "
          f"{'FI fused':>8s} {'FI fp8':>8s} {'FI r+a':>8s} {'FI r+fp4':>8s} | {'kvrope':>8s} {'kip':>8s} | "
          f"{'k/FI1':>6s} {'k/FI2':>6s} {'kip/FI2':>7s}", flush=True)
    results, tokens_of, tables = [], {}, {}
    for c in cases:
        key = (c["suite"], c["seqs"], c["tokens_per_seq"])
        if key not in tokens_of:  # the page table and tokens of a shape, shared by its 8 configurations
            tokens_of.clear()
            tokens_of[key] = append_tokens(c, args.seed)
        if (c["max_position"], c["d"]) not in tables:  # (the MLA cases' R is 64)
            tables[(c["max_position"], c["d"])] = rope_table(c["max_position"], c["d"])
        pr = Problem(c, tokens_of[key], tables[(c["max_position"], c["d"])], seed=c["id"])
        r = dict(suite=c["suite"], case=c["id"], shape=shape_name(c), hq=c["hq"], cache=c["cache"],
                 query_fp8=c["q8"], mrope=c["mrope"], twin=c["twin"], group=group(c), layout=c["layout"],
                 bytes=case_bytes(c), bytes_key_written=case_bytes(c, True))
        if c.get("mla"):
            r.update(mla=True, latent_dim=c["latent"], nope_dim=c["nope"], rotary_dim=c["d"])
        for name, (call, _, _, _) in methods(pr, fi, kv).items():
            try:
                r[name] = clock.span(call, args.iters)
            except Exception as e:  # noqa: BLE001
                print(f"{c['suite']} case {c['id']} {name}: {type(e).__name__}: {e}")
        del pr
        torch.cuda.empty_cache()
        single = [r[n] for n in ("fi_fused", "fi_fp8") if n in r]
        r["fi_single"] = min(single) if single else None
        r["kvrope_over_fi_single"] = r["kvrope"] / r["fi_single"] if "kvrope" in r and r["fi_single"] else None
        # FI2: the rope + append pair of the case's cache (bf16: FI r+a; NVFP4: FI r+fp4).
        two = r.get("fi_two", r.get("fi_nvfp4"))
        r["kvrope_over_fi_two"] = r["kvrope"] / two if "kvrope" in r and two else None
        r["kip_over_fi_two"] = r["kvrope_kip"] / two if "kvrope_kip" in r and two else None
        results.append(r)
        print(f"{r['suite']:13s} {r['case']:4d} {r['shape']:>8s} {r['hq']:3d} {cache_label(c):>8s} {r['layout']:>3s} "
              f"{r['bytes'] * 1e-6:8.3f} | " + " ".join(f"{fmt(r.get(n)):>8s}" for n in COLUMNS[:FI_COLUMNS]) + " | " +
              " ".join(f"{fmt(r.get(n)):>8s}" for n in COLUMNS[FI_COLUMNS:]) + " | " +
              f"{fmt(r['kvrope_over_fi_single'], '{:.3f}'):>6s} {fmt(r['kvrope_over_fi_two'], '{:.3f}'):>6s} "
              f"{fmt(r['kip_over_fi_two'], '{:.3f}'):>7s}", flush=True)
    print()
    summary = {}
    for suite in sorted({r["suite"] for r in results}):
        # The lines of old over the cases they always covered (group base); the NVFP4, mRoPE and MLA groups after.
        rs = [r for r in results if r["suite"] == suite and r["group"] == "base"]
        for label, key in (("kvrope / FlashInfer single launch", "kvrope_over_fi_single"),
                           ("kvrope / FlashInfer rope+append", "kvrope_over_fi_two"),
                           ("kvrope_kip / FlashInfer rope+append", "kip_over_fi_two")):
            g, n = geomean([r[key] for r in rs])
            summary[f"{suite} {key}"] = g
            if n:
                print(f"{suite} {label} geomean = {g:.3f} (over {n} cases)")
        for name in COLUMNS:
            g, n = geomean([r.get(name) for r in rs])
            if n:
                print(f"{suite} {name} geomean us = {g:.2f} (over {n} cases)")
        rs = [r for r in results if r["suite"] == suite and r["group"] == "nvfp4"]
        for label, key in (("kvrope / FlashInfer rope+nvfp4 append", "kvrope_over_fi_two"),
                           ("kvrope_kip / FlashInfer rope+nvfp4 append", "kip_over_fi_two")):
            g, n = geomean([r[key] for r in rs])
            summary[f"{suite} nvfp4 {key}"] = g
            if n:
                print(f"{suite} nvfp4: {label} geomean = {g:.3f} (over {n} cases)")
        for name in ("fi_nvfp4", "kvrope", "kvrope_kip"):
            g, n = geomean([r.get(name) for r in rs])
            if n:
                print(f"{suite} nvfp4: {name} geomean us = {g:.2f} (over {n} cases)")
        rs = [r for r in results if r["suite"] == suite and r["group"] == "mrope"]
        twins = {r["case"]: r for r in results if r["suite"] == suite}
        for name in ("kvrope", "kvrope_kip"):
            g, n = geomean([r[name] / twins[r["twin"]][name] for r in rs
                            if name in r and r["twin"] in twins and twins[r["twin"]].get(name)])
            summary[f"{suite} mrope {name}_over_ordinary"] = g
            if n:
                print(f"{suite} bf16+mrope: {name} mrope/ordinary geomean = {g:.3f} (over {n} cases with their twin)")
        rs = [r for r in results if r["suite"] == suite and r["group"] == "mla"]
        # The MLA cases (keys and lines only where some ran): each kind against FlashInfer's method doing its work
        # (bf16: its pair; q-fp8: its fp8 kernel in MLA mode), then each method's geomean.
        kinds = (("kvrope / FlashInfer rope+mla append (mla_bf16)", "kvrope_over_fi_two", False),
                 ("kvrope / FlashInfer fp8 kernel in MLA mode (mla_fp8+q8)", "kvrope_over_fi_single", True))
        for label, key, q8 in kinds if rs else ():
            g, n = geomean([r[key] for r in rs if r["query_fp8"] == q8])
            summary[f"{suite} mla {key}"] = g
            if n:
                print(f"{suite} mla: {label} geomean = {g:.3f} (over {n} cases)")
        for name in ("fi_two", "fi_fp8", "kvrope"):
            g, n = geomean([r.get(name) for r in rs])
            if n:
                print(f"{suite} mla: {name} geomean us = {g:.2f} (over {n} cases)")
    if failures:
        print(f"verify: {failures} MISMATCH(ES) (see the verify lines above)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "iters": args.iters, "seed": args.seed,
                       "verify_failures": failures, "cases": results, "geomeans": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
