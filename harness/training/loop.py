"""The training loop: AdamW with linear warm-up and cosine decay, the masked-diffusion
loss of objective.py, and aux-loss-free balancing of every router after each step."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from harness.common.files import write_atomic
from harness.model.llada2 import LLaDA2Model
from harness.training.balance import apply_balance, imbalance
from harness.training.forward import ExpertStack, batched_forward
from harness.training.objective import diffusion_loss, mask_last_block, masked_accuracy, sample_windows


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    tokens_per_step: int = 4096  # rows per step = tokens_per_step // window length
    block_length: int = 32  # the decoding block (block=32 in the paper's tables)
    max_context_blocks: int = 3  # clean blocks before the noisy one: 0..max, uniform per step
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.01
    balance_rate: float = 1e-3  # bias step of the aux-loss-free rule (DeepSeek-V3: 1e-3)
    corpus_bytes: int = 0  # stdlib bytes to learn from (0: all of it)

    def as_dict(self) -> dict:
        return asdict(self)


def learning_rate(step: int, s: TrainSettings) -> float:
    """Linear warm-up to lr, then cosine decay to lr * min_lr_ratio at the last step."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    span = max(1, s.steps - s.warmup_steps)
    progress = min(1.0, (step - s.warmup_steps) / span)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(params: list[torch.nn.Parameter], s: TrainSettings) -> torch.optim.AdamW:
    """Weight decay on matrices only; norms (1-D) are left alone."""
    decay = [p for p in params if p.dim() >= 2]
    keep = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, 0.95), foreach=True)


def train(model: LLaDA2Model, stream: torch.Tensor, s: TrainSettings, seed: int, desc: str = "train"
          ) -> list[dict]:
    """Train in place, on the device the model is on (batches are drawn on the host by a
    seeded generator, then moved); returns one row per step (loss, accuracy, lr, load
    imbalance)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    mask_id = model.config.mask_token_id
    routers = [m.gate for m in model.moe_layers()]
    stacks = [ExpertStack(moe) for moe in model.moe_layers()]
    model.requires_grad_(True)  # the stacks stand in for the routed experts, which are not parameters
    params = [p for p in model.parameters() if p.requires_grad] + [p for st in stacks for p in st.parameters()]
    opt = make_optimizer(params, s)
    history = []
    bar = tqdm(range(s.steps), desc=desc, unit="step", dynamic_ncols=True, mininterval=1.0)
    start = time.perf_counter()
    for step in bar:
        blocks = 1 + int(torch.randint(0, s.max_context_blocks + 1, (1,), generator=gen))
        length = blocks * s.block_length
        rows = max(1, s.tokens_per_step // length)
        batch = mask_last_block(sample_windows(stream, rows, length, gen), s.block_length, mask_id, gen).to(device)
        lr = learning_rate(step, s)
        for group in opt.param_groups:
            group["lr"] = lr
        loads: list[torch.Tensor] = []
        logits = batched_forward(model, batch.ids, s.block_length, loads, last=s.block_length, stacks=stacks)
        loss = diffusion_loss(logits, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        apply_balance(routers, loads, s.balance_rate)
        row = {"step": step, "loss": float(loss.detach()), "masked_acc": masked_accuracy(logits, batch), "lr": lr,
               "imbalance": imbalance(loads), "tokens": rows * length,
               "elapsed_s": round(time.perf_counter() - start, 3)}
        history.append(row)
        bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['masked_acc']:.2f}", imb=f"{row['imbalance']:.2f}",
                        refresh=False)
    bar.close()
    for stack, moe in zip(stacks, model.moe_layers(), strict=True):
        stack.write_back(moe)
    model.requires_grad_(False)
    return history


def write_history(history: list[dict], directory: Path) -> None:
    """train_loss.csv and train_loss.png (loss and its moving average against steps)."""
    import pandas as pd

    df = pd.DataFrame(history)
    text = df.to_csv(index=False)
    write_atomic(directory / "train_loss.csv", lambda f: f.write(text.encode()))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(df["step"], df["loss"], alpha=0.35, label="loss (1/t-weighted masked CE)")
    ax.plot(df["step"], df["loss"].rolling(max(1, len(df) // 20), min_periods=1).mean(), label="moving average")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(directory / "train_loss.png", dpi=120)
    plt.close(fig)
