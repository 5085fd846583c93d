"""Routing traces on disk and the temporal-stability analysis."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.analyze import main as analyze_main
from harness.common.errors import HarnessError
from harness.placement.steps import StepInfo
from harness.placement.trace import RoutingTrace
from harness.traces.stability import stability_table


def make_trace(loads: torch.Tensor, steps_per_block: int, hints: bool = False) -> RoutingTrace:
    n, layers, experts = loads.shape
    trace = RoutingTrace(layers, experts, geometry={"num_experts": experts}, meta={"model": "synthetic"})
    for i in range(n):
        block, step = divmod(i, steps_per_block)
        trace.add_step(StepInfo(0, block, step, i, block == 0, "denoise"), n_tokens=4, n_context=8 + i)
        for layer in range(layers):
            trace.record(layer, loads[i, layer], torch.rand(experts) if hints else None)
    return trace


def test_round_trip_keeps_everything(tmp_path):
    loads = torch.randint(0, 5, (6, 3, 16), generator=torch.Generator().manual_seed(0))
    trace = make_trace(loads, 3, hints=True)
    trace.steps[2] = StepInfo(1, 4, 2, 2, False, "commit")
    path = trace.save(tmp_path / "t.npz")
    back = RoutingTrace.load(path)
    assert torch.equal(back.loads, trace.loads)
    assert back.steps == trace.steps
    assert back.n_tokens == trace.n_tokens and back.n_context == trace.n_context
    assert back.geometry == trace.geometry and back.meta == trace.meta
    assert all(torch.equal(back.hint(s, 1), trace.hint(s, 1)) for s in range(6))


def test_corrupt_trace_is_one_line_error(tmp_path):
    path = tmp_path / "bad.npz"
    path.write_bytes(b"not a zip file at all")
    with pytest.raises(HarnessError, match="corrupt"):
        RoutingTrace.load(path)
    with pytest.raises(HarnessError, match="does not exist"):
        RoutingTrace.load(tmp_path / "missing.npz")


def test_version_mismatch_is_refused(tmp_path):
    trace = make_trace(torch.ones(2, 1, 4, dtype=torch.int32), 2)
    path = trace.save(tmp_path / "t.npz")
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data["schema_version"] = np.array(999)
    np.savez_compressed(path, **data)
    with pytest.raises(HarnessError, match="schema version 999"):
        RoutingTrace.load(path)


def test_stability_of_a_constant_routing_is_one():
    loads = torch.zeros(8, 2, 16, dtype=torch.int32)
    loads[:, :, :4] = 3
    table = stability_table(make_trace(loads, 8), experts_per_layer=4, max_k=3)
    assert table["cosine"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert table["topB_retained"].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_stability_with_known_drift():
    # one-hot loads that move by one expert per step: orthogonal, nothing retained
    loads = torch.zeros(6, 1, 8, dtype=torch.int32)
    for i in range(6):
        loads[i, 0, i] = 1
    table = stability_table(make_trace(loads, 6), experts_per_layer=1, max_k=2)
    assert table["cosine"].tolist() == pytest.approx([0.0, 0.0])
    assert table["topB_retained"].tolist() == pytest.approx([0.0, 0.0])
    # half of the top-2 set kept: {i, i+1} vs {i+1, i+2}
    loads = torch.zeros(6, 1, 8, dtype=torch.int32)
    for i in range(6):
        loads[i, 0, i] = loads[i, 0, i + 1] = 1
    table = stability_table(make_trace(loads, 6), experts_per_layer=2, max_k=1)
    assert table["topB_retained"].tolist() == pytest.approx([0.5])
    assert table["cosine"].tolist() == pytest.approx([0.5])


def test_pairs_never_cross_blocks():
    loads = torch.randint(1, 4, (8, 1, 8), generator=torch.Generator().manual_seed(1))
    table = stability_table(make_trace(loads, 4), experts_per_layer=2, max_k=4)
    # 2 blocks of 4 steps: k=1 has 3 pairs per block, k=4 none
    assert table["pairs"].tolist() == [6, 4, 2, 0]


def test_analyze_cli_writes_table_and_plot(tmp_path, capsys):
    loads = torch.randint(0, 4, (8, 2, 16), generator=torch.Generator().manual_seed(2))
    path = make_trace(loads, 4).save(tmp_path / "trace.npz")
    assert analyze_main([f"trace={path}", "B=4", "max_k=3"]) == 0
    assert (tmp_path / "stability.csv").exists() and (tmp_path / "stability.png").exists()
    assert "topB_retained" in capsys.readouterr().out
    with pytest.raises(HarnessError, match="unknown argument"):
        analyze_main([f"trace={path}", "bogus=1"])
