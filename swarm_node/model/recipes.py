"""`MODEL_RECIPES`: the embedded model's recipes by name, and the one a node builds when no model is given.

A recipe is deterministic: `key()` names its cache directory (a change of anything it is built from is a new
directory), `build(path, progress)` writes a whole HF model directory, `facts()` is what the directory's
`swarm_node_recipe.json` records (the model's own generation budget `max_new_tokens` among them).

- `bpe-think-answer-v2` (the default, `think_recipe.py`): a Qwen2.5-shaped model that reasons in think-answer.
- `char-answer-line-v1` (`char_recipe.py`): the earlier default, character tokenizer, answer-line; for reproducing
  earlier results (`model.recipe = "char-answer-line-v1"`, with `sampler.max_new_tokens` left at 0 it gets its 8).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from swarm_node import variants
from swarm_node.model.char_recipe import CharRecipe
from swarm_node.model.think_recipe import ThinkRecipe

ProgressFn = Callable[[int, int, str], None]
DEFAULT_RECIPE = variants.MODEL_RECIPES[0]


class ModelRecipe(Protocol):
    def key(self) -> str: ...

    def task_mix(self) -> tuple[dict[str, Any], ...]: ...

    def facts(self) -> dict[str, Any]: ...

    def build(self, path: Path, progress: ProgressFn | None) -> None: ...


MODEL_RECIPES: variants.Registry[ModelRecipe] = variants.Registry("model.recipe", variants.MODEL_RECIPES)
MODEL_RECIPES.add("bpe-think-answer-v2", ThinkRecipe())
MODEL_RECIPES.add("char-answer-line-v1", CharRecipe())
