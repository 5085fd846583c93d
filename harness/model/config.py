"""LLaDA2-MoE configuration: the fields of an HF `config.json` the harness uses, plus the
parameter and byte counts the budget and the cost model are built on."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.paths import file_kind, require_regular_file

# more positions than any published model serves (10M at most): a corrupt or hand-edited config
MAX_POSITIONS = 1 << 24

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_MASK_ID = 156895
DEFAULT_EOS_ID = 156892


POSITIVE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                   "n_group", "topk_group", "routed_scaling_factor", "rope_theta", "rms_norm_eps",
                   "max_position_embeddings")


def check_field_types(values: dict) -> None:
    """Each config.json field the harness reads has its dataclass type: an int (not a bool)
    for counts, a finite number for floats, a bool or a string where those are expected."""
    types = {f.name: f.type for f in fields(LLaDA2Config)}
    for name, value in values.items():
        kind = types[name]
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise HarnessError(f"config.json has {name}={value!r}; it must be {_KIND_WORDS[kind]}")


_KIND_WORDS = {"int": "an integer", "float": "a finite number", "bool": "true or false", "str": "a string"}
# Features of the published config class that this model does not implement, with the one
# value it computes correctly. A config.json asking for anything else would load and then
# compute the wrong thing, so it is refused. A key that is absent takes the implemented
# value: published checkpoints write every key, only hand-written (proxy) configs omit some.
IMPLEMENTED_FEATURES: dict[str, object] = {
    "use_qkv_bias": False,  # bias on query_key_value
    "use_bias": False,  # bias on the attention output projection
    "use_qk_norm": True,  # per-head RMSNorm of queries and keys
    "use_rmsnorm": True,
    "hidden_act": "silu",
    "score_function": "sigmoid",
    "norm_topk_prob": True,  # routed weights normalised over the top-k
    "norm_head": False,
    "norm_softmax": False,
    "rope_scaling": None,
    "use_sliding_window": False,
    "using_split_qkv_in_self_attention": False,
    "tie_word_embeddings": False,
    "moe_router_enable_expert_bias": True,
    "router_dtype": "fp32",
}


def check_implemented(raw: dict) -> None:
    """One line naming the first config.json feature this model does not implement."""
    for key, implemented in IMPLEMENTED_FEATURES.items():
        if key in raw and raw[key] != implemented:
            raise HarnessError(
                f"config.json sets {key}={raw[key]!r}, which this LLaDA2 implementation does not support "
                f"(it computes {key}={implemented!r} only); use a checkpoint without it or implement it in "
                "harness/model/llada2.py"
            )
    if raw.get("num_shared_experts") in (None, 0):
        raise HarnessError("config.json has no shared expert (num_shared_experts=0); this implementation "
                           "always adds one, as LLaDA2.0-mini and -flash do")


# The reference's config class (LLaDA2MoeConfig in the TIDE repo's model/configuration_llada2_moe.py)
# fills a key config.json omits with its own class default, which for most keys is not
# LLaDA2.0's value. Where the two agree, a missing key takes it; elsewhere a missing key is
# refused: filling it with LLaDA2.0-mini's value would load a model the reference does not.
REFERENCE_DEFAULTS: dict[str, object] = {
    "vocab_size": 30592, "hidden_size": 1024, "intermediate_size": None, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 0, "rms_norm_eps": 1e-05, "max_position_embeddings": 16384,
    "rope_theta": 10000.0, "num_experts": 16, "num_shared_experts": 0, "num_experts_per_tok": 2, "n_group": 8,
    "topk_group": 4, "routed_scaling_factor": 2.5, "moe_intermediate_size": None, "first_k_dense_replace": 0,
    "partial_rotary_factor": 0.5, "tie_word_embeddings": False,
}


def check_missing_keys(raw: dict) -> None:
    """One line naming the first key config.json omits whose reference default is not
    LLaDA2.0's (head_dim is derived as the reference derives it; the token ids come from
    the tokenizer there)."""
    defaults = {f.name: f.default for f in fields(LLaDA2Config)}
    for key, reference in REFERENCE_DEFAULTS.items():
        if key not in raw and reference != defaults[key]:
            raise HarnessError(
                f"config.json has no {key}: the reference's config class would take its default {reference!r}, "
                f"not LLaDA2.0's {defaults[key]!r}; write {key} into config.json")


class ParamTotals:
    """What a geometry derives from its non-expert and per-expert parameter counts (LLaDA2Config
    here, FamilyGeometry for the transformers families): totals, and bytes at a width."""

    non_expert_params: int
    expert_params: int
    n_moe_layers: int
    num_experts: int
    num_experts_per_tok: int

    @property
    def total_params(self) -> int:
        """Reference definition: tests check it against the published model sizes."""
        return self.non_expert_params + self.n_moe_layers * self.num_experts * self.expert_params

    @property
    def active_params(self) -> int:
        """Reference definition: tests check it against the published model sizes."""
        return self.non_expert_params + self.n_moe_layers * self.num_experts_per_tok * self.expert_params

    def expert_bytes(self, bytes_per_param: int = 2) -> int:
        return self.expert_params * bytes_per_param

    def non_expert_bytes(self, bytes_per_param: int = 2) -> int:
        return self.non_expert_params * bytes_per_param


@dataclass(frozen=True)
class LLaDA2Config(ParamTotals):
    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int = 5120
    moe_intermediate_size: int = 512
    num_hidden_layers: int = 20
    first_k_dense_replace: int = 1
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 128
    num_experts: int = 256
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    partial_rotary_factor: float = 0.5
    rope_theta: float = 600000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    # Not in the published config.json (the ids live in the tokenizer there); proxy
    # checkpoints write them explicitly.
    mask_token_id: int = DEFAULT_MASK_ID
    eos_token_id: int = DEFAULT_EOS_ID
    model_type: str = "llada2_moe"

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict) -> LLaDA2Config:
        if not isinstance(raw, dict):
            raise HarnessError(f"config.json holds a JSON {type(raw).__name__}, not an object; "
                               "it must be a Hugging Face model config")
        if raw.get("model_type") != "llada2_moe":
            raise HarnessError(
                f"config.json has model_type={raw.get('model_type')!r}; the harness loads "
                "only 'llada2_moe' checkpoints (LLaDA2.0-mini / -flash)"
            )
        check_implemented(raw)
        check_missing_keys(raw)
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known}
        if kwargs.get("head_dim") is None and "hidden_size" in raw and "num_attention_heads" in raw:
            kwargs["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]  # the reference's default
        if "eos_token_id" not in raw and "pad_token_id" in raw:
            kwargs["eos_token_id"] = raw["pad_token_id"]
        check_field_types(kwargs)
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @classmethod
    def from_json(cls, path: str | Path) -> LLaDA2Config:
        path = Path(path)
        if file_kind(path) not in ("file", "missing"):  # a FIFO would block the read forever
            require_regular_file(path, str(path), "a checkpoint's config.json must be a JSON file")
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise HarnessError(f"missing {path}; a checkpoint directory needs config.json") from None
        except json.JSONDecodeError as exc:
            raise HarnessError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except (UnicodeDecodeError, RecursionError):
            raise HarnessError(f"{path} is not a UTF-8 JSON file; a checkpoint's config.json must be") from None
        except OSError as exc:
            raise HarnessError(f"cannot read {path} ({exc.strerror or exc})") from None
        return cls.from_dict(raw)

    @classmethod
    def published(cls, name: str) -> LLaDA2Config:
        """The nominal geometry of a published model: 'llada2_mini' or 'llada2_flash'."""
        path = CONFIG_DIR / f"{name}.json"
        if not path.exists():
            known = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
            raise HarnessError(f"unknown published config {name!r}; known: {', '.join(known)}")
        return cls.from_json(path)

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        for name in POSITIVE_FIELDS:
            if getattr(self, name) <= 0:
                raise HarnessError(f"config.json has {name}={getattr(self, name)}; it must be positive")
        for name in ("first_k_dense_replace", "num_shared_experts", "mask_token_id", "eos_token_id"):
            if getattr(self, name) < 0:
                raise HarnessError(f"config.json has {name}={getattr(self, name)}; it must be >= 0")
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise HarnessError(f"config.json has first_k_dense_replace={self.first_k_dense_replace} > "
                               f"num_hidden_layers={self.num_hidden_layers}")
        if not 0 < self.partial_rotary_factor <= 1:
            raise HarnessError(f"config.json has partial_rotary_factor={self.partial_rotary_factor}; "
                               "it must be in (0, 1]")
        if self.num_experts % self.n_group:
            raise HarnessError(f"num_experts={self.num_experts} is not divisible by n_group={self.n_group}")
        if self.topk_group > self.n_group:
            raise HarnessError(f"topk_group={self.topk_group} exceeds n_group={self.n_group}")
        if self.num_experts_per_tok > self.topk_group * self.num_experts // self.n_group:
            raise HarnessError("num_experts_per_tok exceeds the experts in the kept groups")
        if self.num_attention_heads % self.num_key_value_heads:
            raise HarnessError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise HarnessError(f"config.json gives a rotary dimension of {self.rotary_dim} (head_dim={self.head_dim} x "
                               f"partial_rotary_factor={self.partial_rotary_factor}); RoPE rotates pairs, so it must "
                               "be even, positive and at most head_dim")
        if self.max_position_embeddings > MAX_POSITIONS:
            raise HarnessError(f"config.json has max_position_embeddings={self.max_position_embeddings}; at most "
                               f"{MAX_POSITIONS} (2**24) positions are served, the checkpoint's config is corrupt")

        for name in ("mask_token_id", "eos_token_id"):
            if getattr(self, name) >= self.vocab_size:
                raise HarnessError(f"config.json has {name}={getattr(self, name)} outside the vocabulary "
                                   f"(vocab_size={self.vocab_size})")

    # ---- geometry -----------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    @property
    def expert_params(self) -> int:
        """One routed expert: gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def attention_params(self) -> int:
        qkv = (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim * self.hidden_size
        dense = self.num_attention_heads * self.head_dim * self.hidden_size
        return qkv + dense + 2 * self.head_dim  # + the two per-head QK norms

    @property
    def non_expert_params(self) -> int:
        """Everything but the routed experts: embeddings, attention, norms, the dense
        layers, routers, expert biases and shared experts."""
        h = self.hidden_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2) + h
        per_layer = self.attention_params + 2 * h
        dense_mlp = 3 * h * self.intermediate_size
        router = self.num_experts * h + self.num_experts
        shared = self.num_shared_experts * self.expert_params
        return (
            embed
            + self.num_hidden_layers * per_layer
            + self.first_k_dense_replace * dense_mlp
            + self.n_moe_layers * (router + shared)
        )

