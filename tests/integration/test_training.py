"""Trained and balanced proxies (harness/training): the balancing rule, the objective, the
cache key, the corpus, and a tiny training run that reloads through `from_pretrained`."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from harness.common.errors import HarnessError
from harness.model.checkpoint import from_pretrained, index_checkpoint
from harness.model.llada2 import route
from harness.training.balance import apply_balance, balance_update
from harness.training.context_use import MASK_RATIOS, describe_context_use, masked_ce_by_ratio
from harness.training.corpus import build_corpus
from harness.training.loop import TrainSettings, learning_rate
from harness.training.objective import NoisyBatch, diffusion_loss, mask_last_block
from harness.training.proxy_cache import (
    TRAIN_SETTINGS,
    check_kind,
    recipe,
    train_proxy,
    trained_dir,
    training_key,
    weights_at,
)

FAST = TrainSettings(steps=20, tokens_per_step=256, max_context_blocks=1, warmup_steps=2, lr=1e-2,
                     balance_rate=5e-3, corpus_bytes=1_000_000)


# ---- balancing --------------------------------------------------------------------------


def test_overloaded_expert_bias_goes_down_idle_goes_up():
    bias = torch.zeros(4)
    new = balance_update(bias, torch.tensor([10, 0, 5, 5]), rate=0.01)  # mean 5
    assert new.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.0])
    per_layer = balance_update(torch.zeros(2, 3), torch.tensor([[3, 0, 0], [1, 1, 1]]), rate=0.5)
    assert per_layer.tolist() == [[-0.5, 0.5, 0.5], [0.0, 0.0, 0.0]]


def test_bias_changes_selection_not_combine_weights():
    """One token, 8 experts in one group; top-2. Raising an idle expert's bias makes it
    selected, and the combine weights stay the normalized *unbiased* scores."""
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05]])
    idx0, w0 = route(scores, torch.zeros(8), top_k=2, n_group=1, topk_group=1, scale=1.0)
    assert sorted(idx0[0].tolist()) == [0, 1]
    bias = balance_update(torch.zeros(8), torch.tensor([9, 9, 0, 1, 1, 1, 1, 1]), rate=0.5)
    idx1, w1 = route(scores, bias, top_k=2, n_group=1, topk_group=1, scale=1.0)
    assert 2 in idx1[0].tolist() and idx1[0].tolist() != idx0[0].tolist()
    expected = scores[0, idx1[0]] / scores[0, idx1[0]].sum()
    assert torch.equal(w1[0], expected)
    # a bias that changes no selection changes no weight, bit for bit
    idx2, w2 = route(scores, torch.full((8,), 0.3), top_k=2, n_group=1, topk_group=1, scale=1.0)
    assert torch.equal(idx2, idx0) and torch.equal(w2, w0)


def test_apply_balance_updates_router_buffers_in_place():
    routers = [torch.nn.Module() for _ in range(2)]
    for r in routers:
        r.register_buffer("expert_bias", torch.zeros(3))
    apply_balance(routers, [torch.tensor([4, 1, 1]), torch.tensor([0, 3, 3])], rate=0.1)
    assert routers[0].expert_bias.tolist() == pytest.approx([-0.1, 0.1, 0.1])
    assert routers[1].expert_bias.tolist() == pytest.approx([0.1, -0.1, -0.1])


# ---- objective and schedule ------------------------------------------------------------------


def test_only_the_last_block_is_masked_and_loss_weights_by_inverse_t():
    gen = torch.Generator().manual_seed(0)
    clean = torch.arange(64).repeat(3, 1)
    batch = mask_last_block(clean, 32, mask_id=99, gen=gen)
    assert not batch.masked[:, :32].any() and batch.masked[:, 32:].any(dim=1).all()
    assert torch.equal(batch.ids[~batch.masked], clean[~batch.masked])
    assert (batch.ids[batch.masked] == 99).all()
    logits = torch.zeros(3, 32, 100)  # uniform prediction: CE = log(100) per masked token
    ratio = [max(float(batch.t[r]), int(batch.masked[r, 32:].sum()) / 32) for r in range(3)]
    expected = sum(int(batch.masked[r].sum()) / ratio[r] for r in range(3)) * torch.log(
        torch.tensor(100.0)) / (3 * 32)
    assert float(diffusion_loss(logits, batch)) == pytest.approx(float(expected), rel=1e-5)


def test_a_row_with_one_forced_mask_is_weighted_by_its_masked_share_not_1_over_t():
    """t = 0.001 masked nothing, so one token was forced: weight 32 (1 of 32 masked), not 1000."""
    clean = torch.zeros(2, 32, dtype=torch.long)
    masked = torch.zeros(2, 32, dtype=torch.bool)
    masked[0, 5] = True  # the forced token of a t=0.001 row
    masked[1, :16] = True  # half the block at t=0.5: weight 1/t = 2
    batch = NoisyBatch(clean, clean, masked, torch.tensor([0.001, 0.5]))
    logits = torch.zeros(2, 32, 4)  # CE = log 4 per masked token
    expected = (1 * 32 + 16 * 2) * math.log(4) / (2 * 32)
    assert float(diffusion_loss(logits, batch)) == pytest.approx(expected, rel=1e-6)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    s = TrainSettings(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(0, s) == pytest.approx(0.1)
    assert learning_rate(9, s) == pytest.approx(1.0)
    assert learning_rate(10, s) == pytest.approx(1.0)
    assert learning_rate(100, s) == pytest.approx(0.1)
    values = [learning_rate(i, s) for i in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(values))


# ---- cache key and corpus -----------------------------------------------------------------------


def test_cache_key_changes_with_corpus_settings_seed_and_code():
    geometry = {"num_experts": 256}
    base = training_key(geometry, "corpus-a", TRAIN_SETTINGS["tiny"], 0, "code-a")
    assert base == training_key(geometry, "corpus-a", TRAIN_SETTINGS["tiny"], 0, "code-a")
    others = [
        training_key(geometry, "corpus-b", TRAIN_SETTINGS["tiny"], 0, "code-a"),
        training_key(geometry, "corpus-a", replace(TRAIN_SETTINGS["tiny"], steps=41), 0, "code-a"),
        training_key(geometry, "corpus-a", replace(TRAIN_SETTINGS["tiny"], lr=1e-4), 0, "code-a"),
        training_key(geometry, "corpus-a", TRAIN_SETTINGS["tiny"], 1, "code-a"),
        training_key(geometry, "corpus-a", TRAIN_SETTINGS["tiny"], 0, "code-b"),
        training_key({"num_experts": 128}, "corpus-a", TRAIN_SETTINGS["tiny"], 0, "code-a"),
        training_key(geometry, "corpus-a", TRAIN_SETTINGS["tiny"], 0, "code-a", device="cuda"),
    ]
    assert len({base, *others}) == 1 + len(others)


def test_gpu_recipe_has_its_own_directory_and_needs_cuda(tmp_path, monkeypatch):
    cpu_dir, gpu_dir = trained_dir("tiny", tmp_path, 0, "cpu"), trained_dir("tiny", tmp_path, 0, "gpu")
    assert cpu_dir != gpu_dir and gpu_dir.name.startswith("trained-tiny-gpu-seed0-")
    assert recipe("tiny", "cpu") == (TRAIN_SETTINGS["tiny"], "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(HarnessError, match="recipe=gpu trains on CUDA") as err:
        recipe("mini", "gpu")
    assert "\n" not in str(err.value)
    with pytest.raises(HarnessError, match="recipe='tpu' is not one of cpu, gpu"):
        recipe("mini", "tpu")
    with pytest.raises(HarnessError, match="unknown proxy"):
        recipe("huge", "cpu")


def test_a_checkpoint_named_by_path_reports_what_it_is(tmp_path):
    for marker, expected in (("training.json", "trained-proxy"), ("balance.json", "random-proxy"), (None, "real")):
        directory = tmp_path / str(marker)
        directory.mkdir()
        if marker:
            (directory / marker).write_text("{}")
        assert weights_at(directory) == expected


def test_corpus_leaves_out_prompt_holders_and_digests_contents(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("# Implement binary search over a sorted list\n")
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_c.py").write_text("y = 2\n")
    prompts = ["implement binary search over a sorted list"]
    corpus = build_corpus(tmp_path, 0, prompts)
    assert corpus.files == ("a.py",) and corpus.held_out == ("pkg/b.py",)  # tests are not the library
    before = corpus.digest
    (tmp_path / "a.py").write_text("x = 2\n")
    assert build_corpus(tmp_path, 0, prompts).digest != before
    with pytest.raises(HarnessError, match="no Python sources"):
        build_corpus(tmp_path / "test", 0, ["y = 2"])


def test_unknown_weight_kind_is_one_line_error():
    with pytest.raises(HarnessError, match=r"model\.weights='fancy'"):
        check_kind("fancy")


# ---- a tiny training run -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_tiny(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("trained") / "tiny"
    train_proxy("tiny", 0, directory, FAST)
    return directory


# ---- does a model use its context? -------------------------------------------------------
V, MASK = 16, 15


def _runs_stream() -> torch.Tensor:
    """Runs of 64 equal tokens: every token equals its neighbours inside a run."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, MASK, (100,), generator=g).repeat_interleave(64)


def _copy_left_neighbour(block: int):
    """Logits of the last block that put the left neighbour's token first where it is
    visible, and are uniform where it is masked: a model that reads its context."""
    def logits(ids: torch.Tensor) -> torch.Tensor:
        left = ids[:, -block - 1:-1]
        out = torch.zeros(ids.shape[0], block, V)
        visible = left != MASK
        out[visible] = 10.0 * F.one_hot(left[visible], V).float()
        return out
    return logits


def test_masked_ce_by_ratio_falls_with_the_ratio_for_a_model_that_reads_its_context():
    ce = masked_ce_by_ratio(_copy_left_neighbour(8), _runs_stream(), 8, MASK, rows=32)
    assert list(ce) == [f"{t:g}" for t in MASK_RATIOS]
    values = list(ce.values())
    # t=1: only the first position's left neighbour (in the clean context block) is visible
    assert values[0] < 1.0 and values[-1] > 7 / 8 * math.log(V) - 0.01
    assert values == sorted(values)  # fewer visible neighbours, worse predictions
    assert "context lowers it" in describe_context_use(ce)
    assert ce == masked_ce_by_ratio(_copy_left_neighbour(8), _runs_stream(), 8, MASK, rows=32)  # seeded


def test_masked_ce_by_ratio_is_flat_for_a_model_that_ignores_its_context():
    def uniform(ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(ids.shape[0], 8, V)
    ce = masked_ce_by_ratio(uniform, _runs_stream(), 8, MASK, rows=32)
    assert all(abs(v - math.log(V)) < 1e-5 for v in ce.values())
    assert "flat" in describe_context_use(ce)


@pytest.mark.slow  # trains tiny (the fixture, once per module)
def test_training_loss_falls_on_tiny(trained_tiny):
    history = pd.read_csv(trained_tiny / "train_loss.csv")
    assert len(history) == FAST.steps
    tenth = max(1, len(history) // 10)
    assert history["loss"].tail(tenth).mean() < history["loss"].head(tenth).mean()
    manifest = json.loads((trained_tiny / "training.json").read_text())
    assert manifest["settings"] == FAST.as_dict() and manifest["corpus"]["files"]
    ce = manifest["masked_ce_by_ratio"]
    assert list(ce) == [f"{t:g}" for t in MASK_RATIOS] and all(0 < v < 2 * math.log(512) for v in ce.values())
    assert (trained_tiny / "train_loss.png").exists()


@pytest.mark.slow
def test_trained_tiny_reloads_bit_identically(trained_tiny):
    model = from_pretrained(trained_tiny)
    entries = index_checkpoint(trained_tiny)
    state = model.state_dict()
    for name, entry in entries.items():
        with safe_open(str(entry.shard), framework="pt") as f:
            stored = f.get_tensor(name)
        assert torch.equal(stored.float(), state[name]), name
    bias = state["model.layers.1.mlp.gate.expert_bias"]
    assert entries["model.layers.1.mlp.gate.expert_bias"].dtype == "F32" and bias.abs().sum() > 0
    ids = torch.arange(8)
    again = from_pretrained(trained_tiny)
    assert torch.equal(model(ids, ids, 4), again(ids, ids, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_tiny_trains_on_cuda_and_reloads_on_the_host(tmp_path):
    directory = tmp_path / "trained-tiny-cuda"
    train_proxy("tiny", 0, directory, FAST, device="cuda")
    history = pd.read_csv(directory / "train_loss.csv")
    tenth = max(1, len(history) // 10)
    assert history["loss"].tail(tenth).mean() < history["loss"].head(tenth).mean()
    assert json.loads((directory / "training.json").read_text())["device"] != "cpu"
    model = from_pretrained(directory)
    assert next(model.parameters()).device.type == "cpu"


def test_random_proxy_bias_is_calibrated_towards_balance(tiny_dir):
    history = json.loads((tiny_dir / "balance.json").read_text())["imbalance_per_step"]
    assert sum(history[-3:]) / 3 < sum(history[:3]) / 3
    model = from_pretrained(tiny_dir)
    assert model.moe_layers()[0].gate.expert_bias.abs().sum() > 0
