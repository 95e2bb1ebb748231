"""Every argument of every public op, given one bad value, is named by the error it raises: the API's
functions (kvrope_torch.forward, forward_, backward, backward_, rope_append_, rotary_embedding_and_cache,
mla_append_)
and the custom ops (torch.ops.kvrope.*), eager and fake (what torch.compile traces). The ops check with
one copy of the checks (csrc/checks.cpp): the CPU and fake ops through kvrope_torch._C.check_*, the CUDA
ops before their launch. CPU tensors, so all of it runs without a GPU; the CUDA variants are skipped
without a device."""
import inspect
import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kvrope_torch

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]
B, H, S, S_MAX, D = 2, 3, 5, 9, 8  # the heads ops' call
T, HQ, HK, DA, PAGES, PAGE, MAX_POS = 5, 4, 2, 16, 4, 4, 40  # the serving forward's call
MN, MR, ML = 8, 8, 24  # the MLA append's call: N, R, L
STYLES = {"rotate_half": 0, "interleaved": 1}


# --- one good call of each op, its arguments by name as the op's schema has them -------------------

def heads_call(device):
    g = torch.Generator().manual_seed(0)

    def rows(length):
        return torch.randn(B, H, length, D, generator=g).to(device)

    angles = torch.rand(B, S, D, generator=g) * 6
    return dict(key_states=rows(S), value_states=rows(S), key_cache=rows(S_MAX), value_cache=rows(S_MAX),
                cache_position=torch.arange(S, device=device), cos=angles.cos().to(device),
                sin=angles.sin().to(device), rotary_dim=0, style=0)


def forward_inplace_call(device):
    return dict(heads_call(device), cos_sin_cache=None, position_ids=None, query=None, query_out=None, key_out=None,
                error_flag=None)


def table_cache(device, r=DA, rows=MAX_POS):
    angles = torch.rand(rows, r // 2 if r % 2 == 0 else r, generator=torch.Generator().manual_seed(1)) * 6
    return torch.cat((angles.cos(), angles.sin()), dim=-1)[:, :r].contiguous().to(device)


def backward_call(device):
    c = heads_call(device)
    return dict(grad_key_cache=torch.randn_like(c["key_cache"]), grad_value_cache=torch.randn_like(c["value_cache"]),
                key_states=c["key_states"], cos=c["cos"], sin=c["sin"], cache_position=c["cache_position"],
                rotary_dim=0, style=0, table_grads=True)


def append_call(device, cache_dtype=torch.float32):
    g = torch.Generator().manual_seed(2)

    def rows(heads):
        return torch.randn(T, heads, DA, generator=g).to(device)

    cache = lambda: torch.zeros(PAGES, PAGE, HK, DA, device=device).to(cache_dtype)  # noqa: E731
    return dict(query=rows(HQ), key=rows(HK), value=rows(HK), positions=torch.arange(T, device=device),
                cos_sin_cache=table_cache(device), key_cache=cache(), value_cache=cache(),
                slot_mapping=torch.arange(T, device=device), query_out=None, key_out=None, key_in_place=False,
                query_norm_weight=None, key_norm_weight=None, norm_eps=1e-6, norm_weight_plus_one=False,
                kv_cache_dtype="auto", k_scale=None, v_scale=None, error_flag=None, rotary_dim=0, style=0,
                q_scale=None, key_cache_sf=None, value_cache_sf=None)


def fp8_append_call(device):
    return append_call(device, torch.float8_e4m3fn)


def mrope_positions(positions):
    """Three streams of T positions (mRoPE), as a [3, T] view of a wider tensor: a stream stride other than T."""
    wide = torch.cat((positions, positions[:2]))
    return torch.stack((wide, wide.flip(0), wide // 2))[:, :positions.shape[0]]


def mrope_append_call(device):
    c = append_call(device)
    return dict(c, positions=mrope_positions(c["positions"]), mrope_section=[2, 3, 3], mrope_interleaved=True)


def nvfp4_append_call(device, d=32):
    """A good call with NVFP4 caches: uint8 codes [pages, P, H, D / 2], float8_e4m3fn block scales [.., D / 16]
    (D a multiple of 32)."""
    g = torch.Generator().manual_seed(3)

    def rows(heads):
        return torch.randn(T, heads, d, generator=g).to(device)

    codes = lambda: torch.zeros(PAGES, PAGE, HK, d // 2, dtype=torch.uint8, device=device)  # noqa: E731
    scales = lambda: torch.zeros(PAGES, PAGE, HK, d // 16, device=device).to(torch.float8_e4m3fn)  # noqa: E731
    return dict(append_call(device), query=rows(HQ), key=rows(HK), value=rows(HK),
                cos_sin_cache=table_cache(device, r=d), key_cache=codes(), value_cache=codes(),
                kv_cache_dtype="nvfp4", key_cache_sf=scales(), value_cache_sf=scales())


def vllm_call(device, cache_dtype=torch.float32):
    c = append_call(device, cache_dtype)
    return dict(positions=c["positions"], query=c["query"].flatten(1), key=c["key"].flatten(1), value=c["value"],
                key_cache=c["key_cache"], value_cache=c["value_cache"], slot_mapping=c["slot_mapping"],
                cos_sin_cache=c["cos_sin_cache"], is_neox=True, kv_cache_dtype="auto", k_scale=None, v_scale=None,
                head_size=None, error_flag=None, query_out=None, q_scale=None)


def fp8_vllm_call(device):
    return vllm_call(device, torch.float8_e4m3fn)


def mrope_vllm_call(device):
    c = vllm_call(device)
    return dict(c, positions=mrope_positions(c["positions"]), mrope_section=[2, 3, 3], mrope_interleaved=False)


def mla_call(device, cache_dtype=torch.float32):
    """A good MLA append: q_pe a view of q [T, Hq, N + R] rotated in place, vLLM's one cache [pages, P, L + R]."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(T, HQ, MN + MR, generator=g).to(device)
    return dict(query_pe=q[..., MN:], kv_c=torch.randn(T, ML, generator=g).to(device),
                k_pe=torch.randn(T, MR, generator=g).to(device), positions=torch.arange(T, device=device),
                cos_sin_cache=table_cache(device, r=MR),
                latent_cache=torch.zeros(PAGES, PAGE, ML + MR, device=device).to(cache_dtype),
                slot_mapping=torch.arange(T, device=device), rope_cache=None, query_nope=None, query_out=None,
                kv_cache_dtype="auto", kv_scale=None, q_scale=None, error_flag=None, style=1)


def mla_split_call(device):
    """FlashInfer's two caches: latent_cache [pages, P, L], rope_cache [pages, P, R]."""
    c = mla_call(device)
    return dict(c, latent_cache=c["latent_cache"][..., :ML].clone(), rope_cache=torch.zeros(PAGES, PAGE, MR,
                                                                                            device=device))


def mla_query_out_call(device):
    """q_pe rotated into query_out [T, Hq, N + R] beside a copy of q_nope."""
    c = mla_call(device)
    q = torch.randn(T, HQ, MN + MR, device=device)
    return dict(c, query_pe=q[..., MN:], query_nope=q[..., :MN], query_out=torch.empty_like(q))


def mla_fp8_call(device):
    return mla_call(device, torch.float8_e4m3fn)


# --- the bad values ------------------------------------------------------------------------------

@dataclass
class Case:
    argument: str  # the argument given a bad value, which the message must name
    change: Callable[[dict], None]  # edits a good call's arguments
    error: type
    where: str = "both"  # "api": the API function only, "op": the custom op only, "both"
    call: Callable = None  # a good call other than the op's usual one
    label: str = ""
    ours: bool = True  # the package's message (False: torch's, of a schema's type)

    @property
    def id(self):
        return self.argument + (f"-{self.label}" if self.label else "")


def put(**values):
    return lambda kw: kw.update(values)


def edit(name, f):
    return lambda kw: kw.update({name: f(kw[name])})


HEADS_CASES = [  # forward and forward_ alike
    Case("key_states", edit("key_states", lambda x: x.int()), TypeError),
    Case("key_states", edit("key_states", lambda x: x[..., :7]), ValueError, label="odd_head_dim"),
    Case("value_states", edit("value_states", lambda x: x[:, :1]), ValueError),
    Case("key_cache", edit("key_cache", lambda x: x[0]), ValueError),
    Case("value_cache", edit("value_cache", lambda x: x.half()), TypeError),
    Case("cache_position", edit("cache_position", lambda x: x.float()), TypeError),
    Case("cache_position", edit("cache_position", lambda x: x[:2]), ValueError, label="length"),
    Case("cos", edit("cos", lambda x: x[:, :2]), ValueError),
    Case("cos", edit("cos", lambda x: x[..., :3]), ValueError, label="odd_rotary_dim"),
    Case("sin", edit("sin", lambda x: x.double()), TypeError),
    Case("sin", edit("sin", lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
         label="last_dim_strided"),
    Case("rotary_dim", put(rotary_dim=4), ValueError, "op"),
    Case("style", put(style=7), ValueError, "op"),
    Case("style", put(style="neox"), ValueError, "api"),
    Case("table_layout", put(table_layout="full"), ValueError, "api"),
]


def with_table_cache(**more):
    def change(kw):
        kw.update(cos=None, sin=None, cos_sin_cache=table_cache(kw["key_states"].device, D),
                  position_ids=kw["cache_position"])
        kw.update(more)
    return change


def with_query(**more):
    def change(kw):
        kw.update(query=torch.randn(B, 4, S, D, device=kw["key_states"].device))
        kw.update({name: f(kw) for name, f in more.items()})
    return change


CASES = {
    "forward": HEADS_CASES + [
        Case("cos", put(cos=None), TypeError, "api", label="none"),  # (torch.ops: torch's schema refuses it)
    ],
    "forward_": HEADS_CASES + [
        Case("cos", put(cos=None), ValueError, label="none"),
        Case("cos_sin_cache", with_table_cache(cos_sin_cache=torch.ones(40, 3)), ValueError),
        Case("cos_sin_cache", lambda kw: kw.update(cos_sin_cache=table_cache(kw["key_states"].device, D),
                                                   position_ids=kw["cache_position"]), ValueError,
             label="and_cos"),
        Case("position_ids", lambda kw: with_table_cache()(kw) or kw.update(position_ids=kw["position_ids"].float()),
             TypeError),
        Case("position_ids", lambda kw: with_table_cache()(kw) or kw.update(position_ids=None), ValueError,
             label="none"),
        Case("query", lambda kw: kw.update(query=torch.randn(B, 4, S, D + 2, device=kw["key_states"].device)),
             ValueError),
        Case("query_out", with_query(query_out=lambda kw: torch.empty_like(kw["query"])[:, :1]), ValueError),
        Case("query_out", lambda kw: kw.update(query_out=torch.empty_like(kw["key_states"])), ValueError,
             label="no_query"),
        Case("key_out", lambda kw: kw.update(key_out=torch.empty_like(kw["key_states"]).double()), TypeError),
        Case("error_flag", lambda kw: kw.update(error_flag=torch.zeros(1, dtype=torch.int64,
                                                                       device=kw["key_states"].device)), ValueError),
    ],
    "backward": [
        Case("grad_key_cache", edit("grad_key_cache", lambda x: x[0]), ValueError),
        Case("grad_key_cache", edit("grad_key_cache", lambda x: x.int()), TypeError, label="dtype"),
        Case("grad_value_cache", edit("grad_value_cache", lambda x: x.half()), TypeError),
        Case("key_states", edit("key_states", lambda x: x[:, :, :2]), ValueError),
        Case("key_states", put(key_states=None), ValueError, label="none"),
        Case("cos", edit("cos", lambda x: torch.cat((x, x[:1]))), ValueError),  # (S from cos: B, not S)
        Case("cos", put(cos=None), TypeError, "api", label="none"),
        Case("sin", edit("sin", lambda x: x.double()), TypeError),
        Case("cache_position", edit("cache_position", lambda x: x[:2]), ValueError),
        Case("cache_position", edit("cache_position", lambda x: x.float()), TypeError, label="dtype"),
        Case("rotary_dim", put(rotary_dim=4), ValueError, "op"),
        Case("style", put(style=7), ValueError, "op"),
        Case("style", put(style="neox"), ValueError, "api"),
        Case("table_grads", put(table_grads="yes"), (TypeError, RuntimeError), "op", ours=False),
    ],
    "rope_append_": [
        Case("query", edit("query", lambda x: x[..., :8]), ValueError),
        Case("key", edit("key", lambda x: x.int()), TypeError),
        Case("key", edit("key", lambda x: x[..., :7]), ValueError, label="odd_head_dim"),
        Case("value", edit("value", lambda x: x[:, :1]), ValueError),
        Case("positions", edit("positions", lambda x: x.float()), TypeError),
        Case("cos_sin_cache", edit("cos_sin_cache", lambda x: x[:, :5]), ValueError),
        Case("cos_sin_cache", edit("cos_sin_cache", lambda x: x.half()), TypeError, label="dtype"),
        Case("key_cache", edit("key_cache", lambda x: x[..., :8]), ValueError),
        Case("key_cache", edit("key_cache", lambda x: x.int()), TypeError, label="dtype"),
        Case("value_cache", edit("value_cache", lambda x: x.half()), TypeError),
        Case("slot_mapping", edit("slot_mapping", lambda x: x.int()), TypeError),
        Case("query_out", lambda kw: kw.update(query_out=torch.empty_like(kw["query"])[:, :1]), ValueError),
        Case("query_out", lambda kw: kw.update(query_out=torch.empty_like(kw["query"], dtype=torch.float8_e5m2)),
             TypeError, label="fp8_format"),
        Case("key_out", lambda kw: kw.update(key_out=torch.empty_like(kw["key"])[:, :1]), ValueError),
        Case("key_in_place", lambda kw: kw.update(key_in_place=True, key_out=torch.empty_like(kw["key"])),
             ValueError),
        Case("query_norm_weight", lambda kw: kw.update(query_norm_weight=torch.ones(8, device=kw["key"].device)),
             ValueError),
        Case("key_norm_weight", lambda kw: kw.update(key_norm_weight=torch.ones(DA, device=kw["key"].device,
                                                                                 dtype=torch.float64)), TypeError),
        Case("norm_eps", put(norm_eps=-1.0), ValueError),
        Case("norm_weight_plus_one", put(norm_weight_plus_one="yes"), (TypeError, RuntimeError), "op", ours=False),
        Case("enable_pdl", put(enable_pdl="yes"), (TypeError, RuntimeError), "op", ours=False),
        Case("kv_cache_dtype", put(kv_cache_dtype="int8"), ValueError),
        Case("kv_cache_dtype", put(kv_cache_dtype="fp8_e5m2"), TypeError, call=fp8_append_call, label="format"),
        Case("k_scale", lambda kw: kw.update(k_scale=torch.ones(1, device=kw["key"].device)), ValueError),
        Case("k_scale", lambda kw: kw.update(k_scale=torch.ones(3, device=kw["key"].device)), ValueError,
             call=fp8_append_call, label="shape"),
        Case("v_scale", lambda kw: kw.update(v_scale=torch.ones(1, device=kw["key"].device, dtype=torch.float64)),
             TypeError, call=fp8_append_call),
        Case("error_flag", lambda kw: kw.update(error_flag=torch.zeros(2, dtype=torch.int32, device=kw["key"].device)),
             ValueError),
        Case("rotary_dim", put(rotary_dim=4), ValueError, "op"),
        Case("style", put(style=7), ValueError, "op"),
        Case("style", put(style="neox"), ValueError, "api"),
        Case("q_scale", lambda kw: kw.update(q_scale=torch.ones(1, device=kw["key"].device)), ValueError),
        Case("q_scale", lambda kw: kw.update(query_out=torch.empty_like(kw["query"], dtype=torch.float8_e4m3fn),
                                             q_scale=torch.ones(2, device=kw["key"].device)), ValueError,
             label="shape"),
        Case("layout", put(layout="NDH"), ValueError, "api"),
        Case("layout", put(layout="HND"), ValueError, "api", call=lambda device: dict(
            append_call(device), key_cache=torch.zeros(PAGES * PAGE, HK, DA, device=device)), label="flat_cache"),
        # mRoPE: positions [3, T] and mrope_section (three ints summing to R/2 = 8)
        Case("mrope_section", put(mrope_section=[2, 3, 4]), ValueError, call=mrope_append_call, label="sum"),
        Case("mrope_section", put(mrope_section=[-1, 5, 4]), ValueError, call=mrope_append_call, label="negative"),
        Case("mrope_section", put(mrope_section=[4, 4]), ValueError, call=mrope_append_call, label="two"),
        Case("mrope_section", put(mrope_section="abc"), TypeError, "api", call=mrope_append_call, label="str"),
        Case("mrope_section", put(mrope_section="abc"), (TypeError, RuntimeError), "op", call=mrope_append_call,
             label="str_op", ours=False),
        Case("mrope_interleaved", put(mrope_interleaved=True), ValueError),  # without mrope_section
        Case("positions", lambda kw: kw.update(positions=mrope_positions(kw["positions"])), ValueError,
             label="three_streams_without_mrope_section"),
        Case("positions", edit("positions", lambda x: x[0]), ValueError, call=mrope_append_call, label="mrope_1d"),
        Case("positions", edit("positions", lambda x: x[:, :-1]), ValueError, call=mrope_append_call,
             label="mrope_short"),
        Case("positions", edit("positions", lambda x: x.t().contiguous().t()), ValueError, call=mrope_append_call,
             label="mrope_last_dim_strided"),
        # NVFP4 caches (kv_cache_dtype "nvfp4"): uint8 codes, float8_e4m3fn block scales, D and R multiples of 32
        Case("kv_cache_dtype", put(kv_cache_dtype="nvfp4"), TypeError, label="nvfp4_float_cache"),
        Case("key_cache", edit("key_cache", lambda x: x[..., :8]), ValueError, call=nvfp4_append_call,
             label="nvfp4_shape"),
        Case("key_cache_sf", lambda kw: kw.update(key_cache_sf=torch.zeros(PAGES, PAGE, HK, 1, device=kw["key"].device)
                                                  .to(torch.float8_e4m3fn)), ValueError, label="not_nvfp4"),
        Case("key_cache_sf", edit("key_cache_sf", lambda x: x.view(torch.uint8)), TypeError, call=nvfp4_append_call,
             label="dtype"),
        Case("key_cache_sf", put(key_cache_sf=None), ValueError, call=nvfp4_append_call, label="none"),
        Case("value_cache_sf", edit("value_cache_sf", lambda x: x[..., :1]), ValueError, call=nvfp4_append_call),
        Case("value_cache_sf", lambda kw: kw.update(value_cache_sf=torch.zeros(PAGES, PAGE, HK, 1, device=kw["key"]
                                                                               .device).to(torch.float8_e4m3fn)),
             ValueError, label="not_nvfp4"),
        Case("key", lambda kw: None, ValueError, call=lambda device: nvfp4_append_call(device, d=48),
             label="nvfp4_head_dim"),
        Case("cos_sin_cache", lambda kw: kw.update(cos_sin_cache=table_cache(kw["key"].device, r=16)), ValueError,
             call=lambda device: nvfp4_append_call(device, d=64), label="nvfp4_rotary_dim"),
        Case("k_scale", lambda kw: kw.update(k_scale=torch.ones(3, device=kw["key"].device)), ValueError,
             call=nvfp4_append_call, label="nvfp4_shape"),
    ],
    "mla_append_": [
        Case("query_pe", edit("query_pe", lambda x: x[..., :4]), ValueError),
        Case("query_pe", edit("query_pe", lambda x: x.double()), TypeError, label="dtype"),
        Case("kv_c", edit("kv_c", lambda x: x.int()), TypeError),
        Case("kv_c", edit("kv_c", lambda x: x[None]), ValueError, label="rank"),
        Case("kv_c", edit("kv_c", lambda x: x[:, :0]), ValueError, label="no_latent_dims"),
        Case("k_pe", edit("k_pe", lambda x: x[:, :5]), ValueError),
        Case("k_pe", edit("k_pe", lambda x: x.half()), TypeError, label="dtype"),
        Case("positions", edit("positions", lambda x: x.float()), TypeError),
        Case("positions", edit("positions", lambda x: x[:2]), ValueError, label="length"),
        Case("cos_sin_cache", edit("cos_sin_cache", lambda x: x[:, :4].contiguous()), ValueError),
        Case("cos_sin_cache", edit("cos_sin_cache", lambda x: x.half()), TypeError, label="dtype"),
        Case("latent_cache", edit("latent_cache", lambda x: x[..., :ML]), ValueError),
        Case("latent_cache", edit("latent_cache", lambda x: x.int()), TypeError, label="dtype"),
        Case("latent_cache", edit("latent_cache", lambda x: x[..., :MR + 2]), ValueError, call=mla_split_call,
             label="split"),
        Case("slot_mapping", edit("slot_mapping", lambda x: x.int()), TypeError),
        Case("slot_mapping", edit("slot_mapping", lambda x: x[:2]), ValueError, label="length"),
        Case("rope_cache", edit("rope_cache", lambda x: x[..., :4]), ValueError, call=mla_split_call),
        Case("rope_cache", edit("rope_cache", lambda x: x[:, :1]), ValueError, call=mla_split_call, label="pages"),
        Case("rope_cache", edit("rope_cache", lambda x: x.half()), TypeError, call=mla_split_call, label="dtype"),
        Case("query_nope", lambda kw: kw.update(query_nope=torch.zeros(T, HQ, MN, device=kw["kv_c"].device)),
             ValueError),
        Case("query_nope", edit("query_nope", lambda x: x[:, :1]), ValueError, call=mla_query_out_call,
             label="heads"),
        Case("query_out", lambda kw: kw.update(query_out=torch.empty(T, HQ, MR - 2, device=kw["kv_c"].device)),
             ValueError),
        Case("query_out", edit("query_out", lambda x: x[..., 1:]), ValueError, call=mla_query_out_call,
             label="nope_dims"),
        Case("query_out", edit("query_out", lambda x: x.to(torch.float8_e5m2)), TypeError, call=mla_query_out_call,
             label="fp8_format"),
        Case("query_out", lambda kw: kw.update(query_pe=None, query_nope=None), ValueError, call=mla_query_out_call,
             label="no_query_pe"),
        Case("kv_cache_dtype", put(kv_cache_dtype="nvfp4"), ValueError),
        Case("kv_cache_dtype", put(kv_cache_dtype="fp8_e5m2"), TypeError, call=mla_fp8_call, label="format"),
        Case("kv_scale", lambda kw: kw.update(kv_scale=torch.ones(1, device=kw["kv_c"].device)), ValueError),
        Case("kv_scale", lambda kw: kw.update(kv_scale=torch.ones(2, device=kw["kv_c"].device)), ValueError,
             call=mla_fp8_call, label="shape"),
        Case("kv_scale", lambda kw: kw.update(kv_scale=torch.ones(1, device=kw["kv_c"].device, dtype=torch.float64)),
             TypeError, call=mla_fp8_call, label="dtype"),
        Case("q_scale", lambda kw: kw.update(q_scale=torch.ones(1, device=kw["kv_c"].device)), ValueError),
        Case("error_flag", lambda kw: kw.update(error_flag=torch.zeros(2, dtype=torch.int32,
                                                                       device=kw["kv_c"].device)), ValueError),
        Case("style", put(style=7), ValueError, "op"),
        Case("style", put(style="neox"), ValueError, "api"),
        Case("enable_pdl", put(enable_pdl="yes"), (TypeError, RuntimeError), "op", ours=False),
    ],
    "rotary_embedding_and_cache": [
        Case("positions", edit("positions", lambda x: x.float()), TypeError),
        Case("query", edit("query", lambda x: x[:, :-3]), ValueError),
        Case("key", edit("key", lambda x: x.int()), TypeError),
        Case("value", edit("value", lambda x: x[:, :1]), ValueError),
        Case("key_cache", edit("key_cache", lambda x: x.half()), TypeError),
        Case("value_cache", edit("value_cache", lambda x: x[:2]), ValueError),
        Case("slot_mapping", lambda kw: kw.update(slot_mapping=torch.arange(T + 1, device=kw["key"].device)),
             ValueError),
        Case("slot_mapping", edit("slot_mapping", lambda x: x.int()), TypeError, label="dtype"),
        Case("cos_sin_cache", edit("cos_sin_cache", lambda x: x[:, :5]), ValueError),
        Case("kv_cache_dtype", put(kv_cache_dtype="int8"), ValueError),
        Case("kv_cache_dtype", put(kv_cache_dtype="nvfp4"), ValueError, label="nvfp4"),
        Case("k_scale", lambda kw: kw.update(k_scale=torch.ones(3, device=kw["key"].device)), ValueError,
             call=fp8_vllm_call),
        Case("v_scale", lambda kw: kw.update(v_scale=torch.ones(1, device=kw["key"].device, dtype=torch.float64)),
             TypeError, call=fp8_vllm_call),
        Case("head_size", put(head_size=8), ValueError),
        Case("error_flag", lambda kw: kw.update(error_flag=torch.zeros(1, dtype=torch.float32,
                                                                       device=kw["key"].device)), ValueError),
        Case("query_out", lambda kw: kw.update(query_out=torch.empty_like(kw["query"])[:, :-3]), ValueError),
        Case("q_scale", lambda kw: kw.update(q_scale=torch.ones(1, device=kw["key"].device)), ValueError),
        Case("mrope_section", put(mrope_section=[1, 1, 1]), ValueError, call=mrope_vllm_call),
        Case("mrope_interleaved", put(mrope_interleaved=True), ValueError),  # without mrope_section
        Case("positions", edit("positions", lambda x: x[:2]), ValueError, call=mrope_vllm_call, label="mrope"),
    ],
}
CASES["backward_"] = CASES["backward"]

# The API's arguments no value of which is refused (a flag read for its truth: bool(x)), by function.
NO_BAD_VALUE = {
    "forward": {"check"},
    "backward": {"check", "table_grads"},
    "backward_": {"table_grads"},
    "rope_append_": {"check", "norm_weight_plus_one", "enable_pdl"},
    "rotary_embedding_and_cache": {"is_neox", "enable_pdl"},
    "mla_append_": {"check", "enable_pdl"},
    "forward_": set(),
}
GOOD_CALLS = {"forward": heads_call, "forward_": forward_inplace_call, "backward": backward_call,
              "backward_": backward_call, "rope_append_": append_call, "rotary_embedding_and_cache": vllm_call,
              "mla_append_": mla_call}
API_OPS = list(GOOD_CALLS)
CUSTOM_OPS = ["forward", "forward_", "backward", "backward_", "rope_append_", "mla_append_"]


def api_arguments(op):
    return list(inspect.signature(getattr(kvrope_torch, op)).parameters)


def schema_arguments(op):
    return [a.name for a in getattr(torch.ops.kvrope, op).default._schema.arguments]


def cases(ops, where):
    return [pytest.param(op, case, id=f"{op}-{case.id}") for op in ops for case in CASES[op]
            if case.where in ("both", where)]


def assert_names(error, case):
    message, argument = str(error.value), case.argument
    assert message.startswith("kvrope") or not case.ours, message
    assert re.search(rf"(?<![\w.]){argument}(?!\w)", message), f"{argument} not named in: {message}"


def api_call(op, kw):
    """The API function's arguments from the schema's: the style by its name, no rotary_dim."""
    names = api_arguments(op)
    kw = {name: value for name, value in kw.items() if name in names}
    if isinstance(kw.get("style"), int):
        kw["style"] = {v: k for k, v in STYLES.items()}[kw["style"]]
    return kw


@pytest.mark.parametrize("op", API_OPS)
def test_every_argument_has_a_case(op):
    """Every argument of the API function and of the custom op has a bad value here, or none exists."""
    api = {c.argument for c in CASES[op] if c.where in ("both", "api")}
    assert set(api_arguments(op)) - NO_BAD_VALUE[op] == api
    if op in CUSTOM_OPS:
        assert set(schema_arguments(op)) == {c.argument for c in CASES[op] if c.where in ("both", "op")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op, case", cases(API_OPS, "api"))
def test_api_names_the_argument(device, op, case):
    kw = (case.call or GOOD_CALLS[op])(device)
    case.change(kw)
    with pytest.raises(case.error) as error:
        getattr(kvrope_torch, op)(**api_call(op, kw))
    assert_names(error, case)


def op_arguments(op, kw):
    return {name: kw[name] for name in schema_arguments(op) if name in kw}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op, case", cases(CUSTOM_OPS, "op"))
def test_op_names_the_argument(device, op, case):
    """torch.ops.kvrope.<op>: the CPU (or CUDA) kernel's checks."""
    kw = (case.call or GOOD_CALLS[op])(device)
    case.change(kw)
    with pytest.raises(case.error) as error:
        getattr(torch.ops.kvrope, op).default(**op_arguments(op, kw))
    assert_names(error, case)


@pytest.mark.parametrize("op, case", cases(CUSTOM_OPS, "op"))
def test_fake_op_names_the_argument(op, case):
    """The fake kernel (what torch.compile traces) raises what the real one does."""
    kw = (case.call or GOOD_CALLS[op])("cpu")
    case.change(kw)
    kw = op_arguments(op, kw)
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        with pytest.raises(case.error) as fake_error:
            getattr(torch.ops.kvrope, op).default(**fake)
    with pytest.raises(case.error) as error:
        getattr(torch.ops.kvrope, op).default(**kw)
    assert_names(fake_error, case)
    assert str(fake_error.value) == str(error.value)


def test_dynamic_shapes_are_checked_when_the_op_runs():
    """Under torch.compile with dynamic shapes the fake kernel sees symbolic sizes, which the C++ checks
    cannot read: it leaves them to the op, which refuses a bad call when it runs, naming the argument."""
    def call(**changes):
        kw = heads_call("cpu")
        del kw["rotary_dim"], kw["style"]
        kw.update({name: f(kw[name]) for name, f in changes.items()})
        return kw

    compiled = torch.compile(lambda **kw: kvrope_torch.forward(**kw), dynamic=True, fullgraph=True)
    for got, want in zip(compiled(**call()), kvrope_torch.forward(**call())):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"kvrope: value_states has shape \[2, 1, 5, 8\], expected \[2, 3, 5, 8\]"):
        compiled(**call(value_states=lambda x: x[:, :1]))
