"""The masked-diffusion objective in the block-causal setting the decoding loop uses.

A training example is a window of corpus tokens cut into blocks: every block before the
last is clean context, the last block is masked with ratio t ~ U(0, 1) (each token
independently with probability t), and the loss is the cross-entropy on the masked
positions weighted by 1/t, averaged over the block's positions (the LLaDA objective, an
upper bound on the negative log-likelihood). Under the block-causal mask the context
blocks never see the noisy block, exactly as finished blocks never see the current one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

MIN_T = 1e-3  # LLaDA's floor on the mask ratio: 1/t stays bounded


@dataclass
class NoisyBatch:
    ids: torch.Tensor  # [B, S] model input: context clean, last block partly masked
    targets: torch.Tensor  # [B, S] the clean tokens
    masked: torch.Tensor  # bool [B, S]: masked positions (only in the last block)
    t: torch.Tensor  # [B] the mask ratio of each row

    def to(self, device: torch.device | str) -> NoisyBatch:
        """The batch on `device` (drawn on the host, where the seeded generator lives)."""
        return NoisyBatch(self.ids.to(device), self.targets.to(device), self.masked.to(device), self.t.to(device))


def sample_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` windows of `length` tokens at uniform random offsets of the token stream."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return stream[starts[:, None] + torch.arange(length)]


def mask_last_block(clean: torch.Tensor, block_length: int, mask_id: int, gen: torch.Generator) -> NoisyBatch:
    """Mask each token of the last block with probability t ~ U(MIN_T, 1), per row; at
    least one token per row is masked, so every row contributes to the loss."""
    b, s = clean.shape
    t = MIN_T + (1 - MIN_T) * torch.rand(b, generator=gen)
    in_block = torch.arange(s) >= s - block_length
    masked = (torch.rand(b, s, generator=gen) < t[:, None]) & in_block
    forced = s - block_length + torch.randint(0, block_length, (b,), generator=gen)
    masked[torch.arange(b), forced] = True
    ids = torch.where(masked, torch.full_like(clean, mask_id), clean)
    return NoisyBatch(ids, clean, masked, t)


def loss_ratio(batch: NoisyBatch, block: int) -> torch.Tensor:
    """The ratio each row's loss is divided by: t, or the share of the block actually
    masked where that is larger. A row whose draw masked nothing gets one forced token;
    weighting it by 1/t (up to 1/MIN_T = 1000) let a few such rows dominate a small batch's
    gradient, which clipping then shrank for every other row (the first trained mini
    learned little more than token frequencies)."""
    share = batch.masked[:, -block:].float().mean(-1)
    return torch.maximum(batch.t, share)


def diffusion_loss(logits: torch.Tensor, batch: NoisyBatch) -> torch.Tensor:
    """logits [B, block, V] of the noisy block: sum over its masked positions of CE / t
    (t per row, see loss_ratio), divided by (rows x block length)."""
    rows, block = logits.shape[:2]
    masked, targets = batch.masked[:, -block:], batch.targets[:, -block:]
    ce = F.cross_entropy(logits[masked], targets[masked], reduction="none")
    weights = (1.0 / loss_ratio(batch, block))[:, None].expand_as(masked)[masked]
    return (ce * weights).sum() / (rows * block)


def masked_accuracy(logits: torch.Tensor, batch: NoisyBatch) -> float:
    """Share of masked positions whose argmax is the clean token (a readable progress figure)."""
    block = logits.shape[1]
    masked, targets = batch.masked[:, -block:], batch.targets[:, -block:]
    with torch.no_grad():
        hit = logits[masked].argmax(-1) == targets[masked]
    return float(hit.float().mean())
