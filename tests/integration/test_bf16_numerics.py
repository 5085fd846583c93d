"""bf16 numerics as the reference: routed experts weighted and summed in fp32, attention
as its eager path (scores in the model dtype, softmax in fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.model.checkpoint import from_pretrained
from harness.model.experts import compute_routed_experts, swiglu
from harness.model.llada2 import block_causal_mask, eager_attention


@pytest.fixture(scope="module")
def bf16_model(tiny_dir):
    return from_pretrained(tiny_dir, dtype="bfloat16")


def fp32_weighted_sum(x, idx, w, experts):
    """Each token: its bf16 expert outputs, weighted in fp32 and summed in fp32 in ascending
    expert id (the canonical order), then cast to bf16."""
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        order = sorted(range(idx.shape[1]), key=lambda j: int(idx[t, j]))
        acc = torch.zeros(x.shape[1], dtype=torch.float32)
        for j in order:
            acc = acc + swiglu(x[t : t + 1], experts[int(idx[t, j])])[0].float() * w[t, j]
        out[t] = acc.to(x.dtype)
    return out


def test_bf16_routed_experts_are_weighted_and_summed_in_fp32(bf16_model):
    moe = bf16_model.moe_layers()[0]
    x = torch.randn(9, bf16_model.config.hidden_size, generator=torch.Generator().manual_seed(3)).bfloat16()
    idx, w = moe.gate(x)
    assert w.dtype == torch.float32
    got = compute_routed_experts(x, idx, w, moe.expert_weights)
    assert got.dtype == torch.float32
    assert torch.equal(got.to(x.dtype), fp32_weighted_sum(x, idx, w, moe.expert_weights))
    # a bf16 sum of bf16-weighted rows rounds differently: the test sees the difference
    bf16_rows = compute_routed_experts(x, idx, w.to(x.dtype), moe.expert_weights)
    assert bf16_rows.dtype == torch.bfloat16 and not torch.equal(bf16_rows, got.to(x.dtype))


def reference_eager(q, k, v, mask, scaling):
    """A port of the reference's eager_attention_forward for one sequence ([1, H, T, D])."""
    n_rep = q.shape[1] // k.shape[1]

    def repeat_kv(h):
        b, kv, s, d = h.shape
        return h[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)

    attn_mask = mask.float().log().to(torch.bfloat16)[None, None]  # the reference's block mask
    weights = torch.matmul(q, repeat_kv(k).transpose(2, 3)) * scaling + attn_mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, repeat_kv(v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_is_the_reference_eager_path_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 12, 16, generator=g).to(dtype)
    k, v = (torch.randn(2, 12, 16, generator=g).to(dtype) for _ in range(2))
    pos = torch.arange(12)
    mask = block_causal_mask(pos, pos, 4)
    got = eager_attention(q, k, v, mask, 16**-0.5)
    assert torch.equal(got, reference_eager(q[None], k[None], v[None], mask, 16**-0.5)[0])


def test_bf16_decode_is_finite_and_deterministic(bf16_model):
    ids, pos = torch.arange(5, 21), torch.arange(16)
    a, b = bf16_model(ids, pos, 8), bf16_model(ids, pos, 8)
    assert torch.isfinite(a).all() and torch.equal(a, b)
