"""Every variant name declared in swarm_node/variants.py (and simulations/variants.py) is registered by its component,
and nothing else is."""

from __future__ import annotations

import pytest

from simulations import variants as sim_variants
from swarm_node import variants
from swarm_node.errors import ConfigError
from swarm_node.variants import Registry, UnknownVariant


def registries() -> list[tuple[Registry[object], tuple[str, ...]]]:
    from simulations.byzantine import ATTACKS
    from simulations.runner import CELL_RUNNERS
    from simulations.scale_sim import DESIGNS
    from swarm_node import tasks
    from swarm_node.config import CORRECTION_CONFIGS, ROLLOUT_CONFIGS, SAMPLER_CONFIGS, STALE_CORRECTION_CONFIGS
    from swarm_node.model.lora import WEIGHT_FORMS
    from swarm_node.model.recipes import MODEL_RECIPES
    from swarm_node.policy_sync.codecs import CODECS
    from swarm_node.rl.advantages import ADVANTAGE_ESTIMATORS
    from swarm_node.rl.loss import LOSSES
    from swarm_node.rl.stale import STALE_CORRECTIONS
    from swarm_node.roles import ROLES
    from swarm_node.sampler.factory import SAMPLERS
    from swarm_node.sampler.kinds import SAMPLER_PLANS
    from swarm_node.sharing.corrections import CORRECTIONS
    from swarm_node.sharing.exchanges import EXCHANGES
    from swarm_node.sharing.selection import SELECTIONS
    from swarm_node.tasks.traces import TRACE_STYLES
    from swarm_node.train.partial import ROLLOUT_MODES

    return [(ADVANTAGE_ESTIMATORS, variants.ADVANTAGES), (LOSSES, variants.LOSSES), (SELECTIONS, variants.SELECTIONS),
            (CODECS, variants.CODECS), (SAMPLERS, variants.SAMPLER_KINDS), (tasks.REWARD_MODES, variants.REWARD_MODES),
            (tasks.TASK_SELECTIONS, variants.TASK_SELECTIONS), (WEIGHT_FORMS, variants.WEIGHT_FORMS),
            (tasks.MIXES, variants.TASK_MIXES), (tasks.SPLITS, variants.EVAL_SPLITS),
            (tasks.ROLLOUT_ALLOCATIONS, variants.ROLLOUT_ALLOCATIONS), (TRACE_STYLES, variants.TRACE_STYLES),
            (ROLES, variants.ROLES), (CELL_RUNNERS, sim_variants.SIM_MODES), (ATTACKS, sim_variants.ATTACKS),
            (DESIGNS, sim_variants.SCALE_DESIGNS),
            (CORRECTIONS, variants.CORRECTIONS), (CORRECTION_CONFIGS, variants.CORRECTIONS),
            (SAMPLER_CONFIGS, variants.SAMPLER_KINDS), (SAMPLER_PLANS, variants.SAMPLER_KINDS),
            (STALE_CORRECTIONS, variants.STALE_CORRECTIONS), (STALE_CORRECTION_CONFIGS, variants.STALE_CORRECTIONS),
            (tasks.PROMPT_FORMATS, variants.PROMPT_FORMATS), (tasks.REWARD_TERMS, variants.REWARD_TERMS),
            (ROLLOUT_MODES, variants.ROLLOUT_MODES), (ROLLOUT_CONFIGS, variants.ROLLOUT_MODES),
            (EXCHANGES, variants.EXCHANGES), (MODEL_RECIPES, variants.MODEL_RECIPES)]


def test_every_declared_name_is_registered() -> None:
    for registry, names in registries():
        assert registry.names == names
        assert sorted(registry) == sorted(names), registry.kind


def test_registry_refuses_undeclared_and_duplicate_names() -> None:
    reg: Registry[int] = Registry("thing", ("a", "b"))
    reg.add("a", 1)
    with pytest.raises(ValueError, match="thing 'c' is not declared"):
        reg.add("c", 3)
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        reg.add("a", 2)
    with pytest.raises(UnknownVariant, match="^unknown thing 'b'; choose one of a, b$"):
        reg["b"]
    assert dict(reg) == {"a": 1} and "b" not in reg and len(reg) == 1


def test_config_rejects_an_unknown_name_of_every_kind() -> None:
    from swarm_node.config import load_config

    for key in ["task.reward", "task.selection", "task.prompt_format", "sampler.kind", "train.advantage", "train.loss",
                "share.correction.kind", "train.stale_correction.kind", "share.selection", "network.role",
                "echo.encoding", "model.recipe"]:
        with pytest.raises(ConfigError, match=f"^{key} 'nope' unknown; choose one of "):
            load_config(overrides={key: "nope"})
