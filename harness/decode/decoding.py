"""The common block-diffusion decoding loop (LLaDA2), shared by every system.

It knows nothing about expert placement: it calls the model and, before every forward,
an optional `on_forward(StepInfo, n_tokens, n_context)` hook that the runner connects
to the expert engine.

Blocks are aligned at position 0: the prompt's whole blocks are context, and its last
partial block is decoded together with the first generated tokens. Within a block every
masked position whose confidence exceeds `threshold` is taken; if that is fewer than the
step's share of the schedule, the most confident ones are taken instead.

The schedule is the reference `generate`'s (the published LLaDA2 modeling code): steps
are clamped to gen_length, and block_length (not the block's masked count) is spread over
them, so a first block that the prompt partly fills takes whole shares and may finish in
fewer steps. A block stops when it has no masked position left.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from harness.common.errors import HarnessError
from harness.placement.steps import ForwardKind, StepInfo

CACHE_MODES = ("prefix", "none")
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 1e3


@dataclass
class DecodeSettings:
    """The decode settings, and the schema of the `decode` config node (harness/job/config.py):
    conf/decode/*.yaml take block_length and steps from the top-level `block`."""

    gen_length: int = 32
    block_length: int = 32
    steps: int = 32  # denoising steps per block
    threshold: float = 0.95
    temperature: float = 0.0
    cache: str = "prefix"  # prefix: cache finished blocks' K/V | none: recompute the window each step
    eos_early_stop: bool = True
    seed: int = 0  # temperature > 0: each prompt's sampler is seeded with it (prompt order never matters)
    # N > 0: each prompt generates gen_length trimmed so that prompt + generation is a multiple of N,
    # as the reference evaluation's buckets (eval_dinfer.py, bucket_size 32); 0: gen_length for all
    gen_length_bucket: int = 0

    def __post_init__(self) -> None:
        """Range and choice checks; each failure is one line naming the key and what is allowed."""
        _require(self.gen_length > 0, f"decode.gen_length={self.gen_length} must be a positive number of tokens")
        _require(self.block_length > 0,
                 f"decode.block_length={self.block_length} must be positive (32 or 64 in the paper)")
        _require(
            1 <= self.steps <= self.block_length,
            f"decode.steps={self.steps} cannot serve decode.block_length={self.block_length}: "
            "steps per block must be between 1 and block_length",
        )
        _require(0 < self.threshold <= 1, f"decode.threshold={self.threshold} must be in (0, 1]")
        _require(math.isfinite(self.temperature),
                 f"decode.temperature={self.temperature} must be a finite number >= 0 (0 = argmax; inf would "
                 "sample uniformly)")
        _require(self.temperature >= 0, f"decode.temperature={self.temperature} must be >= 0 (0 = argmax)")
        _require(self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE,
                 f"decode.temperature={self.temperature} must be 0 (argmax) or between {MIN_TEMPERATURE} and "
                 f"{MAX_TEMPERATURE} (below, logits / temperature overflow; above, sampling is uniform)")
        _require(0 <= self.seed <= 2**63 - 1, f"decode.seed={self.seed} must be in [0, 2**63-1]")
        _require(self.cache in CACHE_MODES, f"decode.cache={self.cache!r} is not allowed; use prefix or none")
        _require(self.gen_length_bucket >= 0,
                 f"decode.gen_length_bucket={self.gen_length_bucket} must be >= 0 (0 = no trimming; the reference "
                 "evaluation uses 32)")
        _require(self.gen_length_bucket <= self.gen_length,
                 f"decode.gen_length_bucket={self.gen_length_bucket} exceeds decode.gen_length={self.gen_length}: a "
                 "prompt could be left nothing to generate; use a bucket of at most gen_length, or 0")

    def reference_shape(self, n_prompts: int) -> tuple[int, int, int]:
        """(prompts, longest, shortest) generation of a decode's token table (lossless.py)."""
        shortest = self.gen_length - self.gen_length_bucket + 1 if self.gen_length_bucket else self.gen_length
        return n_prompts, self.gen_length, shortest

    def for_prompt(self, prompt_tokens: int) -> DecodeSettings:
        """The settings one prompt decodes with: with a bucket N, gen_length becomes
        floor((prompt + gen_length) / N) * N - prompt (at least gen_length - N + 1), as the
        reference evaluation pads (the bucket then spent: 0); else these settings."""
        if not self.gen_length_bucket:
            return self
        n = self.gen_length_bucket
        return replace(self, gen_length=(prompt_tokens + self.gen_length) // n * n - prompt_tokens, gen_length_bucket=0)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise HarnessError(message)


@dataclass
class ForwardRecord:
    prompt: int
    block: int
    step: int
    kind: ForwardKind
    tokens_routed: int  # tokens in the forward's window: each is routed through every MoE layer
    tokens_unmasked: int


@dataclass
class DecodeOutput:
    prompt_ids: list[int]
    generated: list[int]  # gen_length ids after the prompt (still-masked positions keep the mask id)
    n_generated: int  # decoded positions before the first EOS (EOS included)
    records: list[ForwardRecord] = field(default_factory=list)
    stopped_at_eos: bool = False


class Model(Protocol):
    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, block_length: int, cache=None, commit: bool = False
    ) -> torch.Tensor: ...


OnForward = Callable[[StepInfo, int, int], None]


def transfer_schedule(n_tokens: int, steps: int) -> list[int]:
    """Spread n_tokens evenly over the steps, earlier steps taking the remainder."""
    base, rem = divmod(n_tokens, steps)
    return [base + (1 if s < rem else 0) for s in range(steps)]


def steps_per_block(settings: DecodeSettings) -> int:
    """The reference clamps the steps to gen_length (`min(steps, gen_length // minimal_topk)`
    with minimal_topk=1): a 16-token generation gets at most 16 steps per block."""
    return min(settings.steps, settings.gen_length)


def pick_tokens(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and its probability per position. temperature 0 is argmax (no sampling)."""
    if temperature == 0:
        probs = torch.softmax(logits.float(), dim=-1)
        p, tok = probs.max(dim=-1)
        return tok, p
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, probs.gather(-1, tok[:, None]).squeeze(-1)


def check_finite_logits(logits: torch.Tensor, prompt: int, block: int, step: int) -> None:
    """Tokens picked from NaN or Inf logits are garbage that the gpu_only reference (which
    computes the same garbage) would call lossless: refuse them instead."""
    if not bool(torch.isfinite(logits).all()):
        raise HarnessError(f"the model produced NaN or Inf logits (prompt {prompt}, block {block}, step {step}); "
                           "its weights are broken or overflow model.dtype, so no token can be trusted")


def select_positions(conf: torch.Tensor, masked: torch.Tensor, threshold: float, count: int) -> torch.Tensor:
    """Bool mask of positions to unmask: above threshold, or the top-`count` if fewer."""
    conf = conf.masked_fill(~masked, float("-inf"))
    take = masked & (conf > threshold)
    count = min(count, int(masked.sum()))
    if int(take.sum()) < count:
        take = torch.zeros_like(masked)
        take[conf.topk(count).indices] = True
    return take


class _Forwarder:
    """Counts forwards and announces each one to the hook before running it."""

    def __init__(self, model: Model, block_length: int, prompt: int, first_global_step: int, hook: OnForward | None):
        self.model, self.block_length, self.prompt = model, block_length, prompt
        self.global_step, self.hook = first_global_step, hook
        self.records: list[ForwardRecord] = []

    def __call__(self, kind: ForwardKind, block: int, step: int, first_block: bool, ids: torch.Tensor,
                 positions: torch.Tensor, cache, commit: bool = False) -> torch.Tensor:
        info = StepInfo(self.prompt, block, step, self.global_step, first_block, kind)
        n_context = (cache.length if cache is not None else 0) + len(ids)
        if self.hook is not None:
            self.hook(info, len(ids), n_context)
        self.global_step += 1
        self.records.append(ForwardRecord(self.prompt, block, step, kind, len(ids), 0))
        return self.model(ids, positions, self.block_length, cache=cache, commit=commit)


def decode(
    model: Model,
    prompt_ids: list[int],
    settings: DecodeSettings,
    mask_id: int,
    eos_id: int,
    new_cache: Callable[[], object] | None = None,
    on_forward: OnForward | None = None,
    prompt_index: int = 0,
    first_global_step: int = 0,
) -> DecodeOutput:
    """Decode one prompt. `new_cache` makes an empty KV cache (needed for cache='prefix')."""
    lb, p_len = settings.block_length, len(prompt_ids)
    n_blocks = -(-(p_len + settings.gen_length) // lb)
    x = torch.full((n_blocks * lb,), mask_id, dtype=torch.long)
    x[:p_len] = torch.tensor(prompt_ids, dtype=torch.long)
    first_block = p_len // lb
    use_cache = settings.cache == "prefix"
    cache = new_cache() if use_cache and new_cache is not None else None
    if use_cache and cache is None:
        raise ValueError("cache='prefix' needs new_cache")
    generator = torch.Generator().manual_seed(settings.seed) if settings.temperature > 0 else None
    fwd = _Forwarder(model, lb, prompt_index, first_global_step, on_forward)
    steps = steps_per_block(settings)
    schedule = transfer_schedule(lb, steps)  # the same for every block, as the reference

    if use_cache and first_block > 0:  # the prompt's whole blocks: computed once, then cached
        end = first_block * lb
        fwd("prefill", first_block, 0, True, x[:end], torch.arange(end), cache, commit=True)

    stopped = False
    for b in range(first_block, n_blocks):
        start, end = b * lb, (b + 1) * lb
        is_first = b == first_block
        steps_taken = 0
        for s in range(steps):
            masked = x[start:end] == mask_id
            if not bool(masked.any()):
                break
            if use_cache:
                logits = fwd("denoise", b, s, is_first, x[start:end], torch.arange(start, end), cache)
            else:
                logits = fwd("denoise", b, s, is_first, x[:end], torch.arange(end), None)[-lb:]
            check_finite_logits(logits, prompt_index, b, s)
            tok, p = pick_tokens(logits, settings.temperature, generator)
            take = select_positions(p, masked, settings.threshold, schedule[s])
            x[start:end] = torch.where(take, tok, x[start:end])
            fwd.records[-1].tokens_unmasked = int(take.sum())
            steps_taken = s + 1
        generated_so_far = x[p_len:end]
        if settings.eos_early_stop and bool((generated_so_far == eos_id).any()):
            stopped = True
            break
        if use_cache and b + 1 < n_blocks:  # cache the finished block's keys and values
            fwd("commit", b, steps_taken, is_first, x[start:end], torch.arange(start, end), cache, commit=True)

    generated = x[p_len : p_len + settings.gen_length].tolist()
    n_generated = sum(1 for t in generated if t != mask_id)
    if eos_id in generated:
        n_generated = generated.index(eos_id) + 1
    return DecodeOutput(list(prompt_ids), generated, n_generated, fwd.records, stopped)
