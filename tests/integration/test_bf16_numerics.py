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


def fp32_weighted_sum(x, idx, w, experts, sum_order="router"):
    """Each token: its bf16 expert outputs, weighted in fp32 and summed in fp32 in the
    router's top-k order (the reference's `moe_infer`) or ascending expert id, then cast to bf16."""
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        order = list(range(idx.shape[1]))
        if sum_order == "expert_id":
            order.sort(key=lambda j: int(idx[t, j]))
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
    assert not torch.equal(idx, idx.sort(-1).values)  # the router's order is not ascending: the test tells them apart
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


@pytest.mark.parametrize("sum_order", ["router", "expert_id"])
def test_the_moe_layer_sums_in_the_order_it_is_set_to(bf16_model, sum_order):
    """model.expert_sum_order: the layer's output is its shared expert plus the fp32 sum of its
    routed rows in that order, cast to bf16 (docs/model-and-decoding.md "Expert sum order")."""
    moe = bf16_model.moe_layers()[1]
    x = torch.randn(64, bf16_model.config.hidden_size, generator=torch.Generator().manual_seed(5)).bfloat16()
    idx, w = moe.gate(x)
    try:
        bf16_model.set_expert_sum_order(sum_order)
        got = moe(x, bf16_model.engine, None)
    finally:
        bf16_model.set_expert_sum_order("router")
    want = fp32_weighted_sum(x, idx, w, moe.expert_weights, sum_order) + moe.shared_experts(x)
    assert torch.equal(got, want)


def test_an_unknown_sum_order_is_one_line(bf16_model):
    from harness.common.errors import HarnessError

    with pytest.raises(HarnessError, match=r"model\.expert_sum_order='ascending' is not allowed; use one of router"):
        bf16_model.set_expert_sum_order("ascending")


def test_bf16_decode_is_finite_and_deterministic(bf16_model):
    ids, pos = torch.arange(5, 21), torch.arange(16)
    a, b = bf16_model(ids, pos, 8), bf16_model(ids, pos, 8)
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_the_two_sum_orders_round_apart_in_bf16(bf16_model):
    """Both orders are lossless, but they are not the same numbers: some token's bf16 output
    differs between them (else the option would be an empty promise)."""
    moe = bf16_model.moe_layers()[0]
    x = torch.randn(512, bf16_model.config.hidden_size, generator=torch.Generator().manual_seed(7)).bfloat16()
    idx, w = moe.gate(x)
    router = fp32_weighted_sum(x, idx, w, moe.expert_weights, "router")
    by_id = fp32_weighted_sum(x, idx, w, moe.expert_weights, "expert_id")
    assert not torch.equal(router, by_id)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_batched_rows_agree_with_the_per_expert_rows_to_the_last_bits(tiny_dir, dtype):
    """docs/model-and-decoding.md: the gathered (batched) rows of small experts and one F.linear
    chain per expert (the reference's) agree to a product's last bits. In fp32 they round apart
    on every CPU seen; in bf16 whether any row does depends on the CPU's kernels (a few rows on
    an AVX-512 host, none on an AVX2 one), so that is not asserted."""
    from harness.model.experts import gathered_expert_outputs, weighted_expert_outputs

    model = from_pretrained(tiny_dir, dtype=dtype)
    model.refresh_expert_views()
    moe = model.moe_layers()[0]
    g = torch.Generator().manual_seed(11)
    x = torch.randn(256, model.config.hidden_size, generator=g).to(getattr(torch, dtype))
    idx, w = moe.gate(x)
    batched = gathered_expert_outputs(x, idx, w, *moe.expert_weights.stacked())
    per_expert = weighted_expert_outputs(x, idx, w, moe.expert_weights)
    if dtype == "float32":
        assert not torch.equal(batched, per_expert)
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-5  # a bf16 product's last bit; fp32's
    torch.testing.assert_close(batched, per_expert, rtol=tolerance, atol=tolerance)
