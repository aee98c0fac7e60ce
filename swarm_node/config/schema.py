"""How a mapping becomes a frozen config: keys checked, values typed, variants chosen by `kind`.

Contract (generic over the frozen section dataclasses; no section is named here):
- A *variant section* is a base class with a class variable `by_kind` (a `variants.Registry` of kind -> class)
  and a `kind` field; the class built is `by_kind[kind]`, `kind` defaulting to the field's default instance.
- `merge(raw, data, cls, where)` adds one layer (a TOML file, the command line) to `raw`, a nested dict: every key
  must be a field of `cls` (of any variant, for a variant section) and every value of its type, else one
  `ConfigError` line naming the key and `where`. `renamed` maps a dotted key that no longer exists to the line
  that names its new key.
- `build(cls, raw)` makes the frozen instance; a key that belongs to a variant other than the selected one is
  one line naming both.
- `replace_values(obj, {"run.seed": 3})`: a copy with dotted keys changed, typed as `merge` types them; a
  variant's `kind` is chosen when the config is built and is not changed here.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from swarm_node.errors import ConfigError


def is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def variant_classes(cls: type) -> tuple[type, ...]:
    """The classes a section may be: its registered variants, or itself."""
    registry = getattr(cls, "by_kind", None)
    return tuple(registry.values()) if registry is not None else (cls,)


@cache
def field_hints(cls: type) -> dict[str, Any]:
    """Field name -> type, over every variant of a variant section."""
    hints: dict[str, Any] = {}
    for variant in variant_classes(cls):
        resolved = typing.get_type_hints(variant)
        hints.update({f.name: resolved[f.name] for f in dataclasses.fields(variant)})
    return hints


def merge(raw: dict[str, Any], data: Any, cls: type, where: str, renamed: Mapping[str, str],
          prefix: str = "") -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}{where} must be a table")
    hints = field_hints(cls)
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name in renamed:
            raise ConfigError(f"{name}{where} is no longer a key: {renamed[name]}")
        if key not in hints:
            raise ConfigError(f"unknown key {name!r}{where}; known: {', '.join(sorted(hints))}")
        if is_section(hints[key]):
            merge(raw.setdefault(key, {}), value, hints[key], where, renamed, prefix=f"{name}.")
        else:
            raw[key] = coerce(value, hints[key], name, where)


def build(cls: type, raw: Mapping[str, Any], default: Any = None, prefix: str = "") -> Any:
    registry = getattr(cls, "by_kind", None)
    if registry is not None:
        kind = raw.get("kind", (default or cls()).kind)
        if kind not in registry:
            raise ConfigError(f"{prefix}kind {kind!r} unknown; choose one of {', '.join(registry.names)}")
        cls = registry[kind]
        own = {f.name for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in own:
                owners = [name for name, variant in registry.items()
                          if key in {f.name for f in dataclasses.fields(variant)}]
                raise ConfigError(f"{prefix}{key} is a setting of {prefix}kind {' | '.join(owners)}, "
                                  f"not of the selected {kind!r}")
    hints = field_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        if is_section(hints[f.name]):
            inner = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            values[f.name] = build(hints[f.name], raw[f.name], inner, prefix=f"{prefix}{f.name}.")
        else:
            values[f.name] = raw[f.name]
    return cls(**values)


def replace_values(obj: Any, dotted: Mapping[str, Any], where: str = "") -> Any:
    for key, value in dotted.items():
        obj = _replace_one(obj, key.split("."), value, where, "")
    return obj


def _replace_one(obj: Any, path: list[str], value: Any, where: str, prefix: str) -> Any:
    head, rest = path[0], path[1:]
    name = f"{prefix}{head}"
    hints = field_hints(type(obj))
    if head not in hints or head not in {f.name for f in dataclasses.fields(obj)}:
        raise ConfigError(f"unknown key {name!r}{where}")
    if rest:
        return dataclasses.replace(obj, **{head: _replace_one(getattr(obj, head), rest, value, where, f"{name}.")})
    if head == "kind" and getattr(type(obj), "by_kind", None) is not None:
        raise ConfigError(f"{name}{where}: a variant's kind is chosen when the config is loaded")
    return dataclasses.replace(obj, **{head: coerce(value, hints[head], name, where)})


def coerce(value: Any, hint: Any, name: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    expected = origin or hint
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{name}{where} must be true or false, got {value!r}")
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"{name}{where} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"{name}{where} must be {expected.__name__}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}{where} must be finite, got {value!r}")
    return value
