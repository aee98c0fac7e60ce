"""`[share]`: SAPO experience sharing, and `[share.correction]`: one class per off-policy correction of peers'
completions, chosen by `kind` (registry `CORRECTION_CONFIGS`, names `variants.CORRECTIONS`).

The correction's knobs belong to the corrections that read them: `cap` to is, ftis and decoupled, the band
[`band_low`, `band_high`] to ftis alone. `knobs()` is what sharing/corrections.CorrectionParams takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from swarm_node import variants
from swarm_node.config.checks import non_negative, one_of, positive
from swarm_node.errors import ConfigError

# Old [share] keys -> the line naming their new place (config/loading.py reports it).
RENAMED = {
    "share.external_correction": 'use [share.correction] kind = "none" | "is" | "ftis" | "decoupled" '
                                 "(--external-correction on the command line)",
    "share.is_cap": "use [share.correction] cap (kind is, ftis or decoupled)",
    "share.is_band_low": 'use [share.correction] band_low (kind = "ftis")',
    "share.is_band_high": 'use [share.correction] band_high (kind = "ftis")',
}


@dataclass(frozen=True)
class CorrectionConfig:
    """How external completions are weighted by r = pi_local / mu_sender (sharing/corrections.py). Built alone
    it is "none": they train as on-policy (SAPO, rl-swarm)."""

    section: ClassVar[str] = "share.correction"
    by_kind: ClassVar[variants.Registry[type[CorrectionConfig]]]

    kind: str = "none"

    def validate(self) -> None:
        one_of(self, "kind", variants.CORRECTIONS)

    def knobs(self) -> dict[str, float]:
        """This correction's settings, as sharing/corrections.CorrectionParams names them."""
        return {}


CORRECTION_CONFIGS: variants.Registry[type[CorrectionConfig]] = variants.Registry("share.correction config",
                                                                                  variants.CORRECTIONS)
CorrectionConfig.by_kind = CORRECTION_CONFIGS
CORRECTION_CONFIGS.add("none", CorrectionConfig)


@dataclass(frozen=True)
class CappedCorrectionConfig(CorrectionConfig):
    """A correction whose weights are capped at `cap` <= 1: a peer's log-probs may only shrink a gradient."""

    cap: float = 1.0

    def validate(self) -> None:
        super().validate()
        positive(self, "cap")
        if self.cap > 1.0:
            raise ConfigError(f"share.correction.cap must be <= 1 (peers' log-probs may only shrink a gradient), "
                              f"got {self.cap}")

    def knobs(self) -> dict[str, float]:
        return {"cap": self.cap}


@CORRECTION_CONFIGS.register("is")
@dataclass(frozen=True)
class ISCorrectionConfig(CappedCorrectionConfig):
    """A truncated, length-normalised sequence weight."""

    kind: str = "is"


@CORRECTION_CONFIGS.register("decoupled")
@dataclass(frozen=True)
class DecoupledCorrectionConfig(CappedCorrectionConfig):
    """AReaL's decoupled objective, mu_sender as the behaviour policy."""

    kind: str = "decoupled"


@CORRECTION_CONFIGS.register("ftis")
@dataclass(frozen=True)
class FTISCorrectionConfig(CappedCorrectionConfig):
    """Filtered truncated IS per token: tokens whose r leaves [band_low, band_high] are dropped."""

    kind: str = "ftis"
    band_low: float = 0.125  # prime-rl's token mask default
    band_high: float = 8.0

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.band_low <= 1 <= self.band_high:
            raise ConfigError(f"share.correction.band_low and band_high need 0 <= low <= 1 <= high, "
                              f"got [{self.band_low}, {self.band_high}]")

    def knobs(self) -> dict[str, float]:
        return {**super().knobs(), "band_low": self.band_low, "band_high": self.band_high}


@dataclass(frozen=True)
class ShareConfig:
    """Experience sharing (SAPO): each update trains on I local + J external groups.

    local_groups 0 means run.prompts_per_step (solo); external_groups 0 means no external groups are used
    (received groups are still re-scored and pooled). max_external_age counts our own training steps since a
    group was received. `correction` (above) weights the external completions.
    """

    section: ClassVar[str] = "share"

    local_groups: int = 0
    external_groups: int = 0
    max_external_age: int = 4
    # "is" is what the data supports (docs/MEASUREMENTS.md).
    correction: CorrectionConfig = field(default_factory=lambda: ISCorrectionConfig())
    pool_size: int = 256
    per_peer_pool_cap: int = 64
    per_peer_batch_cap: int = 0  # 0: no per-peer limit within one batch beyond external_groups
    # SAPO's zero-advantage filter: a peer's group without signal (every completion scored alike) is refused at the
    # pool. false only for the ablation (bench/sapo_regimes.py, "4/4-nofilter"): such groups are pooled and taken
    # as any other, so they count toward J while training nothing.
    filter_no_signal: bool = True
    selection: str = "uniform"  # variants.SELECTIONS (sharing/selection.py)
    # variants.EXCHANGES (sharing/exchanges.py): "bounded" (issue 32, docs/SWARM_SCALE.md) gossips digests in shards
    # and pulls J groups, so a node's inbound cost does not grow with the swarm; "flood" gossips every group to
    # everyone (the baseline; ECHO-2's worker -> learner path always floods).
    fanin: str = "bounded"
    # A peer's completion that is not well-formed (tasks.well_formed: the answer alone, then EOS) is re-scored 0.
    # false only to measure what the defence is worth (bench/attack.py): peers' verifier-passing junk then counts.
    require_well_formed: bool = True
    # A peer's group costs us at most this many completions and completion ids (sharing/rescore.py): 0 means our
    # own largest group (run.group_size, or the dars allocation's 2 x group_size) and that many x
    # sampler.max_new_tokens ids. Groups of other sizes within the bounds are taken (G + 1, DARS).
    max_group_completions: int = 0
    max_group_tokens: int = 0

    def validate(self) -> None:
        non_negative(self, "local_groups", "external_groups", "max_external_age", "per_peer_batch_cap",
                     "max_group_completions", "max_group_tokens")
        positive(self, "pool_size", "per_peer_pool_cap")
        self.correction.validate()
        one_of(self, "selection", variants.SELECTIONS)
        one_of(self, "fanin", variants.EXCHANGES)
