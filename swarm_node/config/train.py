"""`[train]`: the optimizer, the GRPO loss and its estimator, micro-batching, LoRA and precision; and
`[train.stale_correction]`: one class per correction of our own stale rollouts, chosen by `kind` (registry
`STALE_CORRECTION_CONFIGS`, names `variants.STALE_CORRECTIONS`, the math in rl/stale.py).

A correction's knobs belong to it: `bound` to m2po alone. The truncation cap of tis and vcpo stays
`[train] is_cap` (it also caps the rows of a learner's workers). `knobs()` is what rl/stale.StaleParams takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from swarm_node import variants
from swarm_node.config.checks import non_negative, one_of, positive

M2PO_BOUND = 0.04  # M2PO's tau_M2, the paper's setting (rl/stale.py's default: the config imports no torch)


@dataclass(frozen=True)
class StaleCorrectionConfig:
    """How our own stale rollouts train (rl/stale.py). Built alone it is "none": as if on-policy."""

    section: ClassVar[str] = "train.stale_correction"
    by_kind: ClassVar[variants.Registry[type[StaleCorrectionConfig]]]

    kind: str = "none"

    def validate(self) -> None:
        one_of(self, "kind", variants.STALE_CORRECTIONS)

    def knobs(self) -> dict[str, float]:
        """This correction's settings, as rl/stale.StaleParams names them."""
        return {}


STALE_CORRECTION_CONFIGS: variants.Registry[type[StaleCorrectionConfig]] = variants.Registry(
    "train.stale_correction config", variants.STALE_CORRECTIONS)
StaleCorrectionConfig.by_kind = STALE_CORRECTION_CONFIGS
STALE_CORRECTION_CONFIGS.add("none", StaleCorrectionConfig)


@STALE_CORRECTION_CONFIGS.register("tis")
@dataclass(frozen=True)
class TISStaleConfig(StaleCorrectionConfig):
    """AReaL's decoupled objective with the truncated weight min(pi_proximal / mu, train.is_cap)."""

    kind: str = "tis"


@STALE_CORRECTION_CONFIGS.register("m2po")
@dataclass(frozen=True)
class M2POStaleConfig(StaleCorrectionConfig):
    """M2PO: the most extreme tokens masked until the mean squared log-ratio is <= bound."""

    kind: str = "m2po"
    bound: float = M2PO_BOUND

    def validate(self) -> None:
        super().validate()
        positive(self, "bound")

    def knobs(self) -> dict[str, float]:
        return {"bound": self.bound}


@STALE_CORRECTION_CONFIGS.register("vcpo")
@dataclass(frozen=True)
class VCPOStaleConfig(StaleCorrectionConfig):
    """VCPO: tis's weights, the learning rate scaled by sqrt(ESS / n), the off-policy minimum-variance baseline."""

    kind: str = "vcpo"


@dataclass(frozen=True)
class TrainConfig:
    section: ClassVar[str] = "train"

    # 5e-5: on the embedded model at its own sampling (T 0.7, top-p 0.8) and 32 prompts, 1e-4 lost count_bits and
    # ended lower on validation (docs/DEFAULT_MODEL.md, RL settings)
    lr: float = 5e-5
    warmup_steps: int = 10  # optimizer steps of linear lr warm-up: Adam's first steps are sign-like and large
    minibatches: int = 2  # optimizer steps per batch
    advantage: str = "grpo"  # rl.advantages registry
    loss: str = "grpo"  # rl.loss registry
    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    is_cap: float = 2.0  # truncation of importance weights for off-policy rollouts (stale_correction tis, vcpo)
    # how our own stale rollouts train (rl/stale.py); "tis" is the trainer's behaviour before the registry
    stale_correction: StaleCorrectionConfig = field(default_factory=lambda: TISStaleConfig())
    max_staleness: int = 0  # S: version lag allowed between generation and training; >= 1 overlaps them
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    threads: int = 0  # torch intra-op threads; 0: all cores
    # Padded positions (rows x longest row) per forward/backward (train/batching.py). The default run's minibatches
    # (64 rows of ~84 tokens) fit in one micro-batch, so it computes exactly as an unsplit batch; 64 rows at the
    # default model's full context (256) take two. Logits are positions x vocabulary floats: lower this for a
    # large-vocabulary model.
    microbatch_tokens: int = 8192
    # LoRA (swarm_node/model/lora.py): 0 trains every weight; r > 0 freezes the base and trains rank-r adapters on the
    # attention and MLP projections (scale lora_alpha / r). A simulation's shared vLLM engine serves them.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    # variants.PRECISIONS (model/device.py): "auto" is bf16 autocast on a GPU that supports it, else fp32; the
    # weights and the optimizer state stay fp32 (master weights) either way.
    precision: str = "auto"

    def validate(self) -> None:
        one_of(self, "advantage", variants.ADVANTAGES)
        one_of(self, "precision", variants.PRECISIONS)
        one_of(self, "loss", variants.LOSSES)
        positive(self, "lr", "minibatches", "max_grad_norm", "is_cap", "microbatch_tokens")
        non_negative(self, "eps_low", "eps_high", "kl_coef", "weight_decay", "threads", "warmup_steps",
                      "max_staleness")
        positive(self, "adam_eps", "lora_alpha")
        non_negative(self, "lora_rank")
        self.stale_correction.validate()
