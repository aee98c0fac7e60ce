"""The embedded default model and loading of any local Hugging Face causal-LM directory.

No model hub is reachable, so the default model is built here: a ~1.6M-parameter Qwen2 with the character
tokenizer of `tokenizer.py`, warmed up supervised on the default task so RL starts with some accuracy but
plenty of headroom. The build is deterministic from its recipe, saved as a normal HF directory under the cache
(`$SWARM_NODE_CACHE`, default ~/.cache/swarm-node) and reused; a recipe change gives a new directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
    Qwen2Config,
    Qwen2ForCausalLM,
)

from swarm_node import tasks
from swarm_node.errors import UserError
from swarm_node.model.tokenizer import build_char_tokenizer

ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True)
class DefaultModelRecipe:
    hidden_size: int = 192
    layers: int = 4
    heads: int = 6
    kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 256
    # On tasks.DEFAULT_MIX, 380 steps leave 10-50% held-out accuracy per specialty (docs/TASK_MIX.md): room for RL.
    warmup_steps: int = 380
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    seed: int = 1234
    task_seed: int = 987_654  # warm-up problems come from their own stream, not the RL or eval streams

    def key(self) -> str:
        """Names the cache directory: the recipe and the mix it is warmed up on."""
        # The warm-up skips held-out problems (tasks/heldout.py): a change of the partition is a new model.
        what = {**asdict(self), "mix": tasks.DEFAULT_MIX, "heldout_percent": tasks.EVAL_PERCENT}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    return Path(os.environ.get("SWARM_NODE_CACHE", Path.home() / ".cache" / "swarm-node"))


def random_qwen2(tokenizer: PreTrainedTokenizerBase, recipe: DefaultModelRecipe, seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        intermediate_size=recipe.intermediate_size, max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def warm_up(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: DefaultModelRecipe,
            progress: ProgressFn | None) -> None:
    """Supervised steps on prompt -> answer + EOS over the default mix, loss on the answer tokens only.

    Every batch holds rows of every specialty (balanced draws), and each specialty's rows run as their own padded
    micro-batch, the loss summed over all answer tokens of the batch and divided by their count. Measured: batches of
    one specialty at a time make the model answer "1" to everything; mixed batches learn every specialty."""
    source = tasks.TaskSource(seed=recipe.task_seed, selection="balanced", mix=tasks.DEFAULT_MIX)
    rng = random.Random(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.warmup_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.warmup_lr, total_steps=recipe.warmup_steps,
                                                pct_start=0.1)
    model.train()
    for step in range(recipe.warmup_steps):
        rows: dict[str, list[tuple[list[int], list[int]]]] = {}
        for ref in source.draw(rng, recipe.warmup_batch):
            inst = tasks.instance(ref)
            prompt = tokenizer.encode(inst.prompt)
            answer = tokenizer.encode(inst.answer) + [tokenizer.eos_token_id]
            rows.setdefault(ref.dataset, []).append((prompt + answer, [-100] * len(prompt) + answer))
        answer_tokens = sum(sum(t != -100 for t in labels) for group in rows.values() for _, labels in group)
        opt.zero_grad()
        total = 0.0
        for group in rows.values():
            width = max(len(seq) for seq, _ in group)
            ids = torch.tensor([seq + [tokenizer.pad_token_id] * (width - len(seq)) for seq, _ in group])
            lab = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in group])
            logits = model(input_ids=ids, attention_mask=(lab != -100) | (ids != tokenizer.pad_token_id)).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                     lab[:, 1:].reshape(-1), ignore_index=-100,
                                                     reduction="sum") / answer_tokens
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if progress is not None:
            progress(step + 1, recipe.warmup_steps, f"loss {total:.3f}")
    model.eval()


def ensure_default_model(progress: ProgressFn | None = None,
                         recipe: DefaultModelRecipe = DefaultModelRecipe()) -> Path:
    """Path of the default model directory, building it (once, under a file lock) if missing."""
    root = cache_dir() / "models"
    target = root / f"default-{recipe.key()}"
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent nodes on one machine build it once
        if (target / "config.json").exists():
            return target
        started = time.monotonic()
        tokenizer = build_char_tokenizer()
        model = random_qwen2(tokenizer, recipe, recipe.seed)
        torch.manual_seed(recipe.seed)
        warm_up(model, tokenizer, recipe, progress)
        tmp = root / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "swarm_node_recipe.json").write_text(json.dumps(
            {**asdict(recipe), "build_seconds": round(time.monotonic() - started, 1)}, indent=1))
        os.replace(tmp, target)  # the directory appears whole or not at all
    return target


# Tokenizers saved as a plain tokenizer.json. AutoTokenizer would pick a class from the model type instead (for
# qwen2 in transformers 5, Qwen2Tokenizer, which replaces our character pre-tokenizer and drops spaces).
PLAIN_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
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
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer
