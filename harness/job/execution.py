"""Where a live run computes, chosen once from `backend=` (harness/hybrid/backend.py).

A live run (harness/job/live.py) asks one `Execution` for every step that depends on the
backend, and otherwise never looks at it:

    host (cpu)              the engine computes every routed expert in place on the CPU
                            (OffloadEngine.run_experts); timing is modeled
    device (cuda, standin)  the model is attached to the device and a HybridExecutor runs
                            each layer's plan there (harness/hybrid/executor.py); timing
                            is measured, the modeled figures stay beside it

The reference tokens and the calibration routing come from an all-GPU decode on either
(harness/job/hybrid_setup.py), cached per backend: a device's kernels round differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.accounting.cost import CostModel
from harness.decode.decode_batch import decode_with_engine
from harness.decode.decoding import DecodeSettings, steps_per_block
from harness.decode.loading import LoadedModel
from harness.engine.engine import OffloadEngine
from harness.hybrid.backend import DEVICE_BACKENDS, resolve_backend
from harness.hybrid.executor import HybridExecutor, wrap
from harness.job.hybrid_setup import all_gpu_engine, load_on_device, reference_key
from harness.results.run_result import RunResult
from harness.zoo.entry import load_model

if TYPE_CHECKING:
    from harness.job.config import HarnessConfig


@dataclass(frozen=True)
class Execution:
    backend: str  # resolved: cpu | cuda | standin

    @classmethod
    def choose(cls, name: str) -> Execution:
        """`backend=auto|cpu|cuda|standin` resolved once (one-line error for a bad one)."""
        return cls(resolve_backend(name))

    @property
    def on_device(self) -> bool:
        return self.backend in DEVICE_BACKENDS

    def load(self, cfg: HarnessConfig) -> LoadedModel:
        return load_on_device(cfg, self.backend) if self.on_device else load_model(cfg.model, cfg.cache_dir)

    def cache_key(self, key: str) -> str:
        """The key of an artifact this backend decodes itself (reference tokens, routing)."""
        return reference_key(key, self.backend)

    def reference_tokens(self, loaded: LoadedModel, cost: CostModel, prompts: list[str],
                         settings: DecodeSettings) -> list[list[int]]:
        """The gpu_only tokens of `prompts`, decoded with every expert computed on the GPU."""
        engine = all_gpu_engine(loaded, cost, steps_per_block(settings))
        batch = decode_with_engine(loaded, engine, prompts, settings, desc="reference")
        return [o.generated for o in batch.outputs]

    def runner(self, loaded: LoadedModel, engine: OffloadEngine) -> OffloadEngine | HybridExecutor:
        """What the model's MoE layers call: the engine on the host, an executor on a device."""
        return wrap(loaded.model, engine)

    def close(self, runner: OffloadEngine | HybridExecutor) -> None:
        if isinstance(runner, HybridExecutor):
            runner.close()

    def add_measured(self, result: RunResult, runner: OffloadEngine | HybridExecutor) -> None:
        """On a device, the measured figures into the result (timing=measured)."""
        if isinstance(runner, HybridExecutor):
            apply_measured(result, runner.summary(), self.backend)


def apply_measured(result: RunResult, measured: dict[str, Any], backend: str) -> None:
    """Turn a live result into a measured one: `tokens_per_s` becomes the measured rate,
    the modeled rate stays beside it as `modeled_tokens_per_s`; the measured figures join
    the result's timing."""
    metrics = result.metrics
    metrics["modeled_tokens_per_s"] = metrics["tokens_per_s"]
    seconds = measured["measured_time_s"]
    metrics["tokens_per_s"] = metrics["generated_tokens"] / seconds if seconds > 0 else 0.0
    result.timing.kind = "measured"
    result.timing.figures.update(measured)
    result.identity.backend = backend
