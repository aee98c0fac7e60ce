"""The names of every registered variant, in one leaf module, and the registry type built on them.

Config validation reads the name lists here, so it needs no component. Each component keeps its own
`Registry` (name -> implementation), declared with one of these lists: registering a name that is not declared
raises at import, and `tests/unit/test_variants.py` checks that every declared name is registered. Adding a variant
is two edits: its name here, its `@REGISTRY.register(name)` next to the code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

ADVANTAGES = ("grpo", "dr_grpo", "median")  # rl/advantages.py
LOSSES = ("grpo",)  # rl/loss.py
SELECTIONS = ("uniform", "freshest", "variance")  # sharing/selection.py: which external groups an update takes
CORRECTIONS = ("none", "is", "ftis", "decoupled")  # sharing/corrections.py: how external completions are weighted
STALE_CORRECTIONS = ("none", "tis", "m2po", "vcpo")  # rl/stale.py: how our own stale rollouts are weighted
ROLLOUT_MODES = ("sync", "april", "dynamic")  # train/partial.py: a step's rollouts (april: partial rollouts
# carried over; dynamic: more groups until I have signal, train/dynamic_sampling.py)
CODECS = ("full", "dense-bf16", "topk")  # policy_sync/codecs.py: policy delta encodings
WEIGHT_FORMS = ("full", "base", "adapter")  # model/lora.py: the tensors a sampler loads from a LoRA-trained model
SAMPLER_KINDS = ("auto", "vllm", "native", "hf")  # sampler/factory.py
ROLES = ("peer", "learner", "worker")  # roles/: what `swarm-node join --role` runs
REWARD_MODES = ("exact", "score")  # tasks/source.py: reasoning-gym's score turned into the training reward
REWARD_TERMS = ("format_bonus", "length_penalty")  # tasks/rewards.py: what a well-formed completion's reward adds
PROMPT_FORMATS = ("answer-line", "think-answer", "boxed")  # tasks/formats.py: prompt, answer extraction, shape
ROLLOUT_ALLOCATIONS = ("fixed", "dars")  # tasks/allocation.py: how many completions each prompt of a step gets
TASK_SELECTIONS = ("uniform", "weighted", "balanced", "adaptive")  # tasks/selection.py: each prompt's pick
TASK_MIXES = ("small-2026-11", "reasoning-2026-11")  # tasks/reference.py: the embedded task mixes, by name
EVAL_SPLITS = ("test", "validation")  # tasks/heldout.py: the parts of a problem space never trained on
TRACE_STYLES = ("per-operation", "digit-columns")  # tasks/traces.py: how a think-answer trace writes its steps
DEVICES = ("auto", "cpu", "cuda", "mps")  # model/device.py: where a node computes ("cuda:N" picks a card)
PRECISIONS = ("auto", "fp32", "bf16")  # model/device.py: the autocast dtype of the trainer
EXCHANGES = ("flood", "bounded")  # sharing/exchanges.py: how rollouts travel (every group to all, or digests + pulls)
# model/recipes.py: the embedded model's recipes; the first is the default (`model.recipe`)
MODEL_RECIPES = ("bpe-think-answer-v2", "char-answer-line-v1")
RELAY_MODES = ("auto", "on", "off")  # transport/libp2p/relay.py: serve as a circuit relay (auto: once public)

T = TypeVar("T")


class UnknownVariant(KeyError):
    """A name that its registry does not hold; the message names the choices."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Mapping[str, T], Generic[T]):
    """name -> implementation, restricted to the names declared for `kind`."""

    def __init__(self, kind: str, names: tuple[str, ...]) -> None:
        self.kind = kind
        self.names = names
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name")` on the implementation."""
        def wrap(item: T) -> T:
            self.add(name, item)
            return item
        return wrap

    def add(self, name: str, item: T) -> None:
        if name not in self.names:
            raise ValueError(f"{self.kind} {name!r} is not declared: add it to the names the registry was built with")
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = item

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownVariant(f"unknown {self.kind} {name!r}; choose one of {', '.join(self.names)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
