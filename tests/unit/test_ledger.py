"""The ledger (harness/accounting/ledger.py): its sums are torch's sums in the engine's order, its
timeline on hand-made layers (tests/kernels/test_clock_kernel.py holds the compiled clock
to the scalar layer-by-layer rule, op for op), and how forwards are batched never changes
a bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.accounting.charge import ExpertRuns
from harness.accounting.clock import forward_times
from harness.accounting.cost import CostModel, HardwareConfig, expert_shape
from harness.accounting.ledger import LayerOutcomes, Ledger
from harness.accounting.ordered_sums import constant_row_sums, row_sums, running_sum, table_row_sums, torch_sum
from harness.model.config import LLaDA2Config
from harness.placement.steps import StepInfo

MINI = LLaDA2Config.published("llada2_mini")
TINY = LLaDA2Config(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3)


def test_row_sums_are_torch_sums_of_each_run():
    rng = np.random.default_rng(2)
    lengths = np.concatenate([rng.integers(0, 300, 400), np.full(3000, 40), [1] * 50])  # > torch's grain per length
    values = rng.uniform(1e-6, 1e-3, int(lengths.sum()))
    starts = np.cumsum(lengths) - lengths
    expected = [float(torch.from_numpy(values[a : a + k].copy()).sum()) for a, k in zip(starts, lengths, strict=True)]
    assert row_sums(values, lengths).tolist() == expected
    assert constant_row_sums(3.3e-5, lengths).tolist() == [float(torch.from_numpy(np.full(k, 3.3e-5)).sum())
                                                          for k in lengths.tolist()]
    assert [torch_sum(values[a : a + k]) for a, k in zip(starts, lengths, strict=True)] == expected
    constant = np.full(int(lengths.sum()), 3.3e-5)
    assert row_sums(constant, lengths).tolist() == constant_row_sums(3.3e-5, lengths).tolist()
    total = 0.1
    for v in values[:500].tolist():
        total += v
    assert running_sum(0.1, values[:500]) == total


@pytest.mark.parametrize("flat", [True, False])
def test_table_row_sums_are_torch_sums_of_each_rows_times(flat):
    """Both paths: a table of one value (looked up by row length) and a varying one (gathered)."""
    rng = np.random.default_rng(5)
    loads = rng.integers(0, 6, (3, 7, 40))
    mask = (loads > 0) & (rng.random(loads.shape) < 0.6)
    mask[0, 0] = False  # an empty row sums to 0
    table = np.full(64, 2.5e-5) if flat else rng.uniform(1e-6, 1e-4, 64)
    table[0] = 0.0
    got = table_row_sums(table, loads, mask)
    expected = [[float(torch.from_numpy(table[row[m]]).sum()) for row, m in zip(layer, masks, strict=True)]
                for layer, masks in zip(loads, mask, strict=True)]
    assert got.shape == (3, 7) and got.tolist() == expected


@pytest.mark.parametrize("profile", ["a100", "table", "slow_gpu"])
def test_expert_seconds_are_the_bits_of_the_torch_sums(profile: str) -> None:
    """Each layer's seconds equal summing the cost model's vector function over its
    experts' loads in torch, bit for bit: constant runs (memory-bound experts), mixed
    runs, empty layers and loads past the first table."""
    hw = {
        "a100": HardwareConfig(),
        "table": HardwareConfig(cpu_table_shape=expert_shape(MINI), cpu_table_tokens=[1, 2, 4, 16],
                                cpu_table_seconds=[3e-4, 3.5e-4, 6e-4, 2e-3]),
        "slow_gpu": HardwareConfig(gpu_bf16_tflops=0.5),
    }[profile]
    cost = CostModel(MINI, hw)
    gen = torch.Generator().manual_seed(0)
    rows = [torch.zeros(256, dtype=torch.long), torch.zeros(256, dtype=torch.long)]
    rows[1][7] = 4000
    for k in (1, 2, 3, 7, 8, 9, 31, 64, 100, 165, 256):
        for high in (2, 8, 40, 300, 1000):
            row = torch.zeros(256, dtype=torch.long)
            row[torch.randperm(256, generator=gen)[:k]] = torch.randint(1, high, (k,), generator=gen)
            rows.append(row)
    loads = torch.stack(rows).numpy()
    mask = loads > 0
    for device, times in (("gpu", cost.gpu_expert_times), ("cpu", cost.cpu_expert_times)):
        expected = [float(times(torch.from_numpy(row[row > 0])).sum()) for row in loads]
        for reuse in (False, True):  # one charge (the ledger's) and many (the re-charge's): the same bits
            runs = ExpertRuns(loads[None], mask[None], mask[None].sum(-1), int(loads.max()), reuse)
            table = cost.time_table(device, int(loads.max()))
            assert runs.seconds(table)[0].tolist() == expected
            assert runs.seconds(table)[0].tolist() == expected  # kept by the table's values


def _one_layer(gpu_s, cpu_s, n_sync, n_async, overlap, wait=(0, 0), layers=1):
    n = np.zeros((1, layers), np.int64)
    sync, asyn, wait_row, wait_copies = n.copy(), n.copy(), n.copy(), n.copy()
    sync[0, : len(n_sync)], asyn[0, : len(n_async)] = n_sync, n_async
    wait_row[0, -1], wait_copies[0, -1] = wait
    g = np.zeros((1, layers))
    c = g.copy()
    g[0, : len(gpu_s)], c[0, : len(cpu_s)] = gpu_s, cpu_s
    return forward_times(np.zeros((1, 3)), layers, g, c, sync, asyn, COPY, overlap, wait_row, wait_copies)


A100 = CostModel(MINI, HardwareConfig())
COPY = A100.copy_time(1)


def test_timeline_single_layer_matches_combine() -> None:
    for overlap in (True, False):
        times = _one_layer([1e-3], [2e-3], [2], [1], overlap)
        assert times.total_s[0] == pytest.approx(A100.combine(1e-3, 2 * COPY, 2e-3, overlap, async_copy_s=COPY))
        split = times.copies_s[0, 0] + 1e-3 + times.cpu_exposed_s[0, 0] + times.drain_s[0]
        assert split == pytest.approx(times.total_s[0])


def test_timeline_prefetch_wait_and_fifo_link() -> None:
    # layer 0 computes for 0.5 copies' time and prefetches two experts into layer 1;
    # layer 1 uses the second, which lands at 2c: it waits 1.5c
    times = _one_layer([0.5 * COPY, 0.1 * COPY], [0, 0], [0, 0], [2, 0], False, wait=(0, 2), layers=2)
    assert times.copies_s[0, 1] == pytest.approx(1.5 * COPY)
    # a sync copy in layer 1 queues behind both prefetches: done at 3c, waited 2.5c
    times = _one_layer([0.5 * COPY, 0.1 * COPY], [0, 0], [0, 1], [2, 0], False, layers=2)
    assert times.copies_s[0, 1] == pytest.approx(2.5 * COPY)
    # unused prefetches still have to land before the forward ends
    times = _one_layer([0.5 * COPY], [0], [0], [2], False)
    assert times.total_s[0] == pytest.approx(2 * COPY) and times.drain_s[0] == pytest.approx(1.5 * COPY)


def _outcomes(rng, n, m, e):
    loads = rng.integers(0, 6, (n, m, e)) * (rng.random((n, m, e)) < 0.4)
    on_gpu = (loads > 0) & (rng.random((n, m, e)) < 0.6)
    missed = (loads > 0) & (rng.random((n, m, e)) < 0.3)
    counts = [rng.integers(0, 3, (n, m)) for _ in range(4)]
    return LayerOutcomes(loads, on_gpu, missed, counts[0], counts[1], counts[2], copies_free=counts[3])


def test_batching_never_changes_a_bit():
    """Forwards charged all at once, one by one, or recorded layer by layer as a live run
    does: the same counters and step series, exactly."""
    cost = CostModel(TINY, HardwareConfig(cpu_table_shape=expert_shape(TINY), cpu_table_tokens=[1, 3, 9],
                                          cpu_table_seconds=[1e-4, 2e-4, 5e-4]))
    n, m, e = 70, TINY.n_moe_layers, TINY.num_experts  # more forwards than a live chunk
    out = _outcomes(np.random.default_rng(4), n, m, e)
    steps = [StepInfo(0, s // 8, s % 8, s, s < 8) for s in range(n)]
    sizes = [(4 + s % 3, 10 + s) for s in range(n)]
    ledgers = [Ledger(cost, m, e, overlap=True) for _ in range(3)]
    ledgers[0].charge(steps, sizes, out)
    for s in range(n):
        one = LayerOutcomes(*(a[s : s + 1] for a in (out.loads, out.on_gpu, out.missed, out.copies_sync,
                                                      out.copies_scratch, out.copies_async, out.copies_free)))
        ledgers[1].charge(steps[s : s + 1], sizes[s : s + 1], one)
        ledgers[2].begin_forward(steps[s], *sizes[s])
        for j in range(m):
            ledgers[2].record_layer(out.loads[s, j], out.on_gpu[s, j], out.missed[s, j],
                                    int(out.copies_sync[s, j]), int(out.copies_scratch[s, j]),
                                    int(out.copies_free[s, j]), int(out.copies_async[s, j]))
        ledgers[2].end_forward()
    results = [(ledger.counters_now(), ledger.step_series()) for ledger in ledgers]
    assert results[0][0].missed_pairs > 0 and results[0][0].time_cpu_experts_s > 0
    assert results[1] == results[0] and results[2] == results[0]


def test_an_open_forward_counts_its_layers_but_has_no_step_yet():
    cost = CostModel(TINY, HardwareConfig())
    ledger = Ledger(cost, 2, 8, overlap=False)
    ledger.begin_forward(StepInfo(0, 0, 0, 0, True), 3, 3)
    loads = np.array([2, 0, 1, 0, 0, 0, 0, 0])
    ledger.record_layer(loads, loads > 0, np.arange(8) == 2, 1, 0, 0, 0)
    now = ledger.counters_now()
    assert (now.routed_pairs, now.missed_pairs, now.copies_sync) == (3, 1, 1)
    assert ledger.step_series() == [] and ledger.counters.routed_pairs == 0  # nothing charged for good yet
    ledger.end_forward()
    assert ledger.counters_now().routed_pairs == 3 and len(ledger.step_series()) == 1
