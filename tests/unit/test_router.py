"""The LLaDA2 router on hand-made scores."""

import torch

from harness.model.llada2 import route


def scores_with(values: dict[int, float], n: int = 16, base: float = 0.1) -> torch.Tensor:
    s = torch.full((1, n), base)
    for e, v in values.items():
        s[0, e] = v
    return s


def test_group_masking_drops_experts_of_weak_groups():
    # 4 groups of 4, keep 2 groups, top-2. Group 3 has the single highest expert but a weak
    # second one; groups 0 and 1 have two strong experts each and win on top-2 sums.
    s = scores_with({0: 0.8, 1: 0.8, 4: 0.7, 5: 0.7, 12: 0.9})
    idx, _ = route(s, torch.zeros(16), top_k=2, n_group=4, topk_group=2, scale=1.0)
    assert set(idx[0].tolist()) == {0, 1}  # expert 12 is masked with its group


def test_bias_selects_but_does_not_weigh():
    s = scores_with({0: 0.6, 1: 0.5, 2: 0.4})
    bias = torch.zeros(16)
    bias[2] = 0.3  # lifts expert 2 above expert 1 for selection only
    idx, w = route(s, bias, top_k=2, n_group=1, topk_group=1, scale=1.0)
    assert idx[0].tolist() == [2, 0]
    # weights come from the unbiased scores 0.4 and 0.6, renormalised
    torch.testing.assert_close(w[0], torch.tensor([0.4, 0.6]) / 1.0, rtol=0, atol=1e-6)


def test_weights_renormalised_and_scaled():
    s = scores_with({3: 0.9, 7: 0.3})
    idx, w = route(s, torch.zeros(16), top_k=2, n_group=2, topk_group=2, scale=2.5)
    assert idx[0].tolist() == [3, 7]
    torch.testing.assert_close(w[0], torch.tensor([0.75, 0.25]) * 2.5, rtol=0, atol=1e-6)
    torch.testing.assert_close(w.sum(), torch.tensor(2.5), rtol=0, atol=1e-6)
