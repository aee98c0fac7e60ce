"""The embedded default model's cache, and loading of any local Hugging Face causal-LM directory.

No model hub is reachable, so the default model is built here from a recipe (`recipes.MODEL_RECIPES`, by name;
default `bpe-think-answer-v2`). The build is deterministic from its recipe, saved as a normal HF directory under the
cache (`$SWARM_NODE_CACHE`, default ~/.cache/swarm-node, directory `default-<recipe key>`) with the recipe's facts in
`swarm_node_recipe.json` (`own_budget`: the model's own generation budget), and reused; a recipe change gives a new
directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from swarm_node.errors import UserError
from swarm_node.model.recipes import DEFAULT_RECIPE, MODEL_RECIPES, ModelRecipe

ProgressFn = Callable[[int, int, str], None]
RECIPE_FILE = "swarm_node_recipe.json"


def cache_dir() -> Path:
    return Path(os.environ.get("SWARM_NODE_CACHE", Path.home() / ".cache" / "swarm-node"))


def recipe_of(recipe: str | ModelRecipe) -> ModelRecipe:
    """A recipe by name (`MODEL_RECIPES`), or the recipe object itself (a test's small variant)."""
    return MODEL_RECIPES[recipe] if isinstance(recipe, str) else recipe


def model_dir(recipe: str | ModelRecipe = DEFAULT_RECIPE) -> Path:
    """Where the recipe's model lives in the cache (built or not)."""
    return cache_dir() / "models" / f"default-{recipe_of(recipe).key()}"


def default_model_key(recipe: str | ModelRecipe = DEFAULT_RECIPE) -> str:
    return recipe_of(recipe).key()


def ensure_default_model(progress: ProgressFn | None = None, recipe: str | ModelRecipe = DEFAULT_RECIPE) -> Path:
    """Path of the recipe's model directory, building it (once, under a file lock) if missing."""
    built = recipe_of(recipe)
    target = model_dir(built)
    if (target / "config.json").exists():
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent nodes on one machine build it once
        if (target / "config.json").exists():
            return target
        started = time.monotonic()
        tmp = root / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        built.build(tmp, progress)
        (tmp / RECIPE_FILE).write_text(json.dumps(
            {**built.facts(), "build_seconds": round(time.monotonic() - started, 1)}, indent=1))
        os.replace(tmp, target)  # the directory appears whole or not at all
    return target


def own_budget(path: Path) -> int | None:
    """The generation budget an embedded model's directory declares (`max_new_tokens` of its recipe file), if any."""
    facts = path / RECIPE_FILE
    budget = json.loads(facts.read_text()).get("max_new_tokens") if facts.exists() else None
    return int(budget) if isinstance(budget, int) else None


# Tokenizers saved as a plain tokenizer.json. AutoTokenizer would pick a class from the model type instead (for
# qwen2 in transformers 5, Qwen2Tokenizer, which replaces our character pre-tokenizer and drops spaces).
PLAIN_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # a fast, a SentencePiece or a BPE vocabulary


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise UserError(f"model path {str(path)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): copy the "
                        "model's tokenizer files next to its config.json")
    config_file = path / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.exists() else None
    if declared in PLAIN_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_weights_format(path: Path) -> None:
    """Weights load from safetensors only: a directory whose weights are pickle files (which run code when loaded)
    is one UserError line that says how to convert it."""
    if any(path.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in PICKLE_WEIGHTS for p in path.glob(pattern))
    if pickled:
        raise UserError(
            f"model path {str(path)!r} holds pickle weights only ({pickled[0]}): swarm-node loads safetensors only "
            "(pickle runs code when loaded). If you trust the file, convert it once: python -c \"from transformers "
            f"import AutoModelForCausalLM as M; M.from_pretrained('{path}').save_pretrained('{path}-safetensors')\", "
            "then pass that directory")


def model_config(path: str | Path) -> PretrainedConfig:
    """The config of a local HF model directory, whose weights are safetensors (`check_weights_format`); any problem
    is one UserError line. Never with remote code: a config that needs its own Python (`auto_map`) is refused."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"model path {str(path)!r} is not a directory")
    if not (path / "config.json").exists():
        raise UserError(f"model path {str(path)!r} has no config.json: not a Hugging Face model directory")
    check_weights_format(path)
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot load a causal LM from {str(path)!r}: {str(exc).splitlines()[0]}") from exc


def check_eos_ids(path: Path, generation_eos: int | list[int] | None, vocab: int) -> None:
    """Every EOS id of generation_config.json names a token of the tokenizer (one past it is never sampled, so a
    completion could never end): else one UserError line naming the file."""
    ids = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    outside = [i for i in ids if not 0 <= int(i) < vocab]
    if outside:
        raise UserError(f"{path / 'generation_config.json'}: eos_token_id {outside} outside the tokenizer's "
                        f"vocabulary of {vocab} tokens")


def load_model(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local HF causal-LM directory (fp32 on CPU); any problem is one UserError line."""
    path = Path(path)
    config = model_config(path)
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32,
                                                     config=config, use_safetensors=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot load a causal LM from {str(path)!r}: {str(exc).splitlines()[0]}") from exc
    if tokenizer.eos_token_id is None:
        raise UserError(f"the tokenizer in {str(path)!r} has no EOS token")
    check_eos_ids(path, getattr(model.generation_config, "eos_token_id", None), len(tokenizer))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer
