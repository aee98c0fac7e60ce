"""Value checks every config section shares: each failure is one `ConfigError` line naming `section.key`.

A section class names itself with the class variable `section` (e.g. "share.correction").
"""

from __future__ import annotations

from typing import Any

from swarm_node.errors import ConfigError


def section_of(obj: Any) -> str:
    return str(obj.section)


def one_of(obj: Any, name: str, names: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in names:
        raise ConfigError(f"{section_of(obj)}.{name} {value!r} unknown; choose one of {', '.join(names)}")


def positive(obj: Any, *names: str) -> None:
    for n in names:
        if getattr(obj, n) <= 0:
            raise ConfigError(f"{section_of(obj)}.{n} must be > 0, got {getattr(obj, n)}")


def non_negative(obj: Any, *names: str) -> None:
    for n in names:
        if getattr(obj, n) < 0:
            raise ConfigError(f"{section_of(obj)}.{n} must be >= 0, got {getattr(obj, n)}")
