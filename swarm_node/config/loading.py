"""Loading a `NodeConfig`: defaults < TOML file < CLI overrides, typed, checked, validated and frozen.

A TOML file has one table per section ([run], [model], [task], [sampler], [train], [share] with
[share.correction], [network], [echo], [status], [peers]); CLI flags arrive as dotted overrides ("train.lr",
"share.correction.kind"). Unknown keys, wrong types, impossible values, a key of a variant that is not selected
and a key that was renamed raise `ConfigError` with one line naming the key (the renamed ones: the new key).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tomllib

from swarm_node.config import schema
from swarm_node.config.node import NodeConfig
from swarm_node.config.share import RENAMED as SHARE_RENAMED
from swarm_node.errors import ConfigError

RENAMED: dict[str, str] = {**SHARE_RENAMED}  # dotted old key -> the line naming its new key

Layer = tuple[Mapping[str, Any], str]  # (nested mapping, where it comes from: " in c.toml", " (command line)")


def load_config(toml_path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> NodeConfig:
    """Defaults, then the TOML file, then dotted CLI overrides (None values are skipped); validated."""
    layers: list[Layer] = []
    if toml_path is not None:
        path = Path(toml_path)
        layers.append((read_toml(path, "config file"), f" in {path.name}"))
    layers.append((nest(overrides or {}), " (command line)"))
    return build_config(layers)


def build_config(layers: Iterable[Layer]) -> NodeConfig:
    """The validated, frozen config of the layers, each over the ones before it."""
    raw: dict[str, Any] = {}
    for data, where in layers:
        schema.merge(raw, dict(data), NodeConfig, where, RENAMED)
    config: NodeConfig = schema.build(NodeConfig, raw)
    return config.validate()


def nest(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """{"a.b.c": 1} -> {"a": {"b": {"c": 1}}}; None values are left out."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        if value is None:
            continue
        *tables, leaf = key.split(".")
        node = out
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = value
    return out


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file's tables; a missing or malformed file is one ConfigError line naming it."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} {str(path)!r} not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {exc}") from exc
