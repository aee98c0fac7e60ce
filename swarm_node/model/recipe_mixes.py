"""The task mixes the embedded model recipes are warmed up on, by their names in `tasks.MIXES`: a recipe's cache key and
its warm-up stream depend on its mix, so a recipe names a registered mix (never `tasks.DEFAULT_MIX`, which moves on
when the project's default does).

- `SMALL_MIX`: `small-2026-11`, the mix of `char-answer-line-v1` (one-digit sums and products, gcd up to 30,
  count_bits up to 255).
- `REASONING_MIX`: `reasoning-2026-11`, the mix of `bpe-think-answer-v2` (problem spaces of 20,000 and more questions
  each).
"""

from __future__ import annotations

from typing import Any

from swarm_node import tasks

SMALL_MIX: tuple[dict[str, Any], ...] = tasks.MIXES["small-2026-11"]
REASONING_MIX: tuple[dict[str, Any], ...] = tasks.MIXES["reasoning-2026-11"]
