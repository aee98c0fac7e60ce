"""The node options of `solo` and `join`: which config key each sets, and help texts whose defaults are read
from the config classes (never repeated here).

- `NODE_KEYS`: CLI parameter name -> dotted config key; `node_overrides(params)` turns a command's parameters
  into `load_config` overrides by this table (flags left unset are None and skipped).
- `config_help(key, text)`: "text [default]", the default read from `NodeConfig()`.
"""

from __future__ import annotations

from typing import Any

from cli.common import parse_task_options
from swarm_node.config import NodeConfig

NODE_KEYS = {
    "steps": "run.steps", "group_size": "run.group_size", "prompts_per_step": "run.prompts_per_step",
    "seed": "run.seed", "run_dir": "run.run_dir", "checkpoint_every": "run.checkpoint_every",
    "checkpoint_every_s": "run.checkpoint_every_s",
    "eval_problems": "run.eval_problems", "device": "run.device", "task": "task.name", "model": "model.path",
    "sampler": "sampler.kind", "lr": "train.lr", "minibatches": "train.minibatches",
    "max_staleness": "train.max_staleness", "status_port": "status.port", "status_host": "status.host",
    "status_token": "status.token", "max_new_tokens": "sampler.max_new_tokens",
    "max_model_len": "sampler.max_model_len", "temperature": "sampler.temperature", "lora_rank": "train.lora_rank",
    "prompt_format": "task.prompt_format",
    # join
    "bootstrap": "network.bootstrap", "listen": "network.listen", "announce_addr": "network.announce_addr",
    "identity": "network.identity", "role": "network.role", "learner": "network.learner", "relay": "network.relay",
    "upnp": "network.upnp", "cost_per_hour": "echo.cost_per_hour", "local_groups": "share.local_groups",
    "external_groups": "share.external_groups", "max_external_age": "share.max_external_age",
    "external_correction": "share.correction.kind", "filter_no_signal": "share.filter_no_signal",
}


def default_of(key: str) -> Any:
    value: Any = NodeConfig()
    for part in key.split("."):
        value = getattr(value, part)
    return value


def shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def config_help(key: str, text: str) -> str:
    """`text [default]`, the default that `NodeConfig()` holds for `key`."""
    return f"{text} [{shown(default_of(key))}]"


def node_overrides(params: dict[str, Any]) -> dict[str, object]:
    """The dotted overrides a command's parameters ask for (by `NODE_KEYS`; --resume, --task-option and
    --memory-budget are parsed first)."""
    from swarm_node.train.sizing import parse_mib

    out: dict[str, object] = {key: params[name] for name, key in NODE_KEYS.items() if name in params}
    if "resume" in params:
        out["run.resume"] = True if params["resume"] else None
    if "task_option" in params:
        out["task.options"] = parse_task_options(params["task_option"])
    if params.get("memory_budget"):
        out["run.memory_budget_mib"] = parse_mib(params["memory_budget"])
    return out
