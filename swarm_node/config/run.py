"""`[run]`, `[model]` and `[task]`: what a node runs, on which model and task, where it keeps its files; and
`[run.rollout]`: how a step's rollouts are generated, one class per mode chosen by `kind` (registry
`ROLLOUT_CONFIGS`, names `variants.ROLLOUT_MODES`, the bookkeeping in train/partial.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar

from swarm_node import variants
from swarm_node.config.checks import non_negative, one_of, positive
from swarm_node.errors import ConfigError
from swarm_node.tasks import DATASET_SIZE, DEFAULT_MIX, MIXES, RewardTerms, TaskSource, parse_specialties


@dataclass(frozen=True)
class RolloutConfig:
    """How a step's rollouts are generated. Built alone it is "sync": B prompts, G completions each, to the end."""

    section: ClassVar[str] = "run.rollout"
    by_kind: ClassVar[variants.Registry[type[RolloutConfig]]]

    kind: str = "sync"

    def validate(self) -> None:
        one_of(self, "kind", variants.ROLLOUT_MODES)


ROLLOUT_CONFIGS: variants.Registry[type[RolloutConfig]] = variants.Registry("run.rollout config",
                                                                            variants.ROLLOUT_MODES)
RolloutConfig.by_kind = ROLLOUT_CONFIGS
ROLLOUT_CONFIGS.add("sync", RolloutConfig)


@ROLLOUT_CONFIGS.register("april")
@dataclass(frozen=True)
class AprilRolloutConfig(RolloutConfig):
    """APRIL: request B x (1 + over) prompts, generate in rounds of `chunk_tokens` new tokens, stop once B groups
    are complete and carry the unfinished completions into later steps; a carried completion whose oldest token
    span lags the policy by more than `max_lag` versions is discarded."""

    kind: str = "april"
    over: float = 0.5
    chunk_tokens: int = 32
    max_lag: int = 2

    def validate(self) -> None:
        super().validate()
        positive(self, "chunk_tokens")
        non_negative(self, "over", "max_lag")


@ROLLOUT_CONFIGS.register("dynamic")
@dataclass(frozen=True)
class DynamicRolloutConfig(RolloutConfig):
    """Dynamic sampling (DAPO's, for a node alone): generate more groups until B of them have signal, at most
    `max_factor` x B groups per step; every generated token is counted (train/dynamic_sampling.py)."""

    kind: str = "dynamic"
    max_factor: int = 4

    def validate(self) -> None:
        super().validate()
        positive(self, "max_factor")


@dataclass(frozen=True)
class RunConfig:
    section: ClassVar[str] = "run"

    steps: int = 200
    # B: prompts drawn per step. 32: with 16 (64 completions an optimizer step) RL on the embedded model lost
    # count_bits' greedy accuracy to gradient noise (docs/DEFAULT_MODEL.md, RL settings); with 32 it kept it
    prompts_per_step: int = 32
    group_size: int = 8  # G: completions per prompt
    # variants.ROLLOUT_ALLOCATIONS: fixed (G each) | dars (more completions for hard unsolved prompts, same total)
    rollout_allocation: str = "fixed"
    # None: 0, except for `join`, which derives it from the node's identity (node/assembly.seeded), so that two
    # peers left at the defaults draw different tasks and samples; a seed given reproduces a run exactly.
    seed: int | None = None
    run_dir: str = "runs/solo"
    resume: bool = False
    checkpoint_every: int = 25
    # Also a checkpoint once this many seconds passed since the last one (0: by steps only): a kill loses at most
    # about this much work, however slow the steps are.
    checkpoint_every_s: float = 60.0
    keep_checkpoints: int = 3
    eval_every: int = 0  # 0: only at the end of the run
    eval_problems: int = 200  # 0: no held-out eval
    # Hardware (model/device.py, train/sizing.py, node/hardware.py): where the node computes, and the memory one
    # step may take. device: variants.DEVICES, "cuda:N" for a card; memory_budget_mib 0: a safe fraction of the
    # device's memory (RAM on CPU, VRAM on a GPU). memory_guard false: size by the estimate alone and do not watch
    # the process's memory (a node sharing its process with others: simulations).
    device: str = "auto"
    memory_budget_mib: int = 0
    memory_guard: bool = True
    # `[run.rollout] kind`: variants.ROLLOUT_MODES; "april" carries partial rollouts across steps, "dynamic" generates
    # more groups until B have signal (train/partial.py)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def validate(self) -> None:
        self.rollout.validate()
        positive(self, "steps", "prompts_per_step", "group_size", "checkpoint_every", "keep_checkpoints")
        one_of(self, "rollout_allocation", variants.ROLLOUT_ALLOCATIONS)
        if self.rollout_allocation != "fixed" and self.rollout.kind != "sync":
            raise ConfigError(f"run.rollout_allocation {self.rollout_allocation!r} needs run.rollout.kind 'sync' "
                              f"(APRIL and dynamic sampling draw groups of G), got {self.rollout.kind!r}")
        non_negative(self, "eval_every", "eval_problems", "memory_budget_mib", "checkpoint_every_s")
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"run.seed must be >= 0, got {self.seed}")
        kind, sep, index = self.device.partition(":")
        if kind not in variants.DEVICES or (sep and (kind != "cuda" or not index.isdigit())):
            raise ConfigError(f"run.device {self.device!r} unknown; choose one of auto, cpu, cuda, cuda:N, mps")


@dataclass(frozen=True)
class ModelConfig:
    section: ClassVar[str] = "model"

    path: str = ""  # empty: the embedded model built from `recipe`
    recipe: str = variants.MODEL_RECIPES[0]  # variants.MODEL_RECIPES (model/recipes.py), when `path` is empty

    def validate(self) -> None:
        one_of(self, "recipe", variants.MODEL_RECIPES)


@dataclass(frozen=True)
class TaskConfig:
    """The task: by default the embedded mix (`tasks.DEFAULT_MIX`); or one task (`name`, `options`); or a mix:
    `mix = [{name = "chain_sum", options = {...}, weight = 1.0}, ...]`; or an embedded mix by name (`mix_name`,
    `tasks.MIXES`: an earlier default stays reproducible). `accept`: the (name, options) entries
    taken from peers, default the mix drawn. `prompt_format`: how prompts ask and answers are read (every peer of a
    swarm uses the same); `format_bonus`, `length_penalty`: the reward terms (tasks/rewards.py), 0 = off."""

    section: ClassVar[str] = "task"

    name: str = ""  # empty: the mix (the default mix when `mix` is empty too)
    options: dict[str, Any] = field(default_factory=dict)  # empty: the task's defaults (see tasks/reference.py)
    seed: int = 0
    reward: str = "exact"  # variants.REWARD_MODES: exact | score (reasoning-gym's partial credit)
    # variants.TASK_SELECTIONS: uniform | weighted | balanced | adaptive (each prompt's specialty and index)
    selection: str = "balanced"
    # adaptive: peers' groups, once we re-scored them, feed the pass-rate estimates too (each peer a bounded share)
    adaptive_from_peers: bool = False
    mix: list[dict[str, Any]] = field(default_factory=list)  # empty: `mix_name`, `name`, or else tasks.DEFAULT_MIX
    mix_name: str = ""  # variants.TASK_MIXES: an embedded mix by name, e.g. "small-2026-11" (the first default)
    accept: list[dict[str, Any]] = field(default_factory=list)  # empty: our own mix
    # variants.PROMPT_FORMATS; empty: the model's own (answer-line for the embedded model, think-answer for a model
    # whose tokenizer has a chat template)
    prompt_format: str = ""
    format_bonus: float = 0.0  # added to a well-formed completion's reward, right or wrong
    length_penalty: float = 0.0  # in [0, 1]: a right answer keeps 1 - length_penalty * tokens / max_new_tokens

    def validate(self) -> None:
        non_negative(self, "seed", "format_bonus", "length_penalty")
        if self.prompt_format and self.prompt_format not in variants.PROMPT_FORMATS:
            raise ConfigError(f"task.prompt_format {self.prompt_format!r} unknown; choose one of "
                              f"{', '.join(variants.PROMPT_FORMATS)} (empty: the model's own)")
        if not self.format_bonus < float("inf") or not self.length_penalty <= 1.0:
            raise ConfigError(f"task.format_bonus must be finite and task.length_penalty at most 1, got "
                              f"{self.format_bonus} and {self.length_penalty}")
        one_of(self, "reward", variants.REWARD_MODES)
        one_of(self, "selection", variants.TASK_SELECTIONS)
        if self.mix and (self.name or self.options):
            raise ConfigError("task.mix replaces task.name and task.options: set one or the other")
        if self.mix_name:
            one_of(self, "mix_name", variants.TASK_MIXES)
            if self.mix or self.name:
                raise ConfigError("task.mix_name names a whole mix: set it without task.mix or task.name")
        if self.options and not self.name:
            raise ConfigError("task.options needs task.name (the dataset the options are for)")
        parse_specialties(self.mix, "task.mix")
        parse_specialties(self.accept, "task.accept", weighted=False)

    def specialties(self) -> list[dict[str, Any]]:
        """The mix drawn, as config entries: `mix`, else the embedded mix `mix_name`, else the one task `name`, else
        the embedded default mix."""
        if self.mix:
            return self.mix
        if self.mix_name:
            return copy.deepcopy(list(MIXES[self.mix_name]))
        if self.name:
            return [{"name": self.name, "options": self.options}]
        return copy.deepcopy(list(DEFAULT_MIX))

    def reward_terms(self, budget: int) -> RewardTerms:
        """The reward terms over a generation budget of `budget` ids (sampler.max_new_tokens)."""
        return RewardTerms((("format_bonus", self.format_bonus), ("length_penalty", self.length_penalty)), budget)

    def build_source(self, size: int = DATASET_SIZE, eval_problems: int = 0) -> TaskSource:
        """The node's task source (builds every dataset: an unknown dataset or bad options fail here, and so does a
        test split with fewer distinct questions than an eval of `eval_problems` asks of it)."""
        source = TaskSource(seed=self.seed, size=size, reward=self.reward, selection=self.selection,
                            mix=self.specialties(), accept=self.accept)
        source.eval_refs(eval_problems)  # kept: the eval asks for the same questions
        return source
