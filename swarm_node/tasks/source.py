"""`TaskSource`: a node's task mix (one or more reasoning-gym datasets, each with options and a weight), its
training stream, its held-out eval stream, what it accepts from peers, and its training reward.

Contract:
- A mix is a sequence of specialties (dataset name, canonical options, weight > 0), names unique; a single task
  (`name`, `options`) is a mix of one. `parse_specialties` checks the structure of config entries (no dataset is
  built); `TaskSource` builds every dataset once, so an unknown dataset or bad options fail at construction.
- `draw(rng, count, turn)`: training references, in the order the selection (`TASK_SELECTIONS`) picks (`adaptive`
  reads the source's `book`, a `PassRateBook` the node feeds with scored groups); a pick on a held-out problem
  (test or validation, `heldout.py`) is replaced by a deterministic redraw that does not touch `rng`, so the
  stream is the selection's stream wherever it picks a training problem.
- `eval_refs(count, split)`: `count` distinct questions of one held-out split (`heldout.SPLITS`: "test" by default,
  "validation" for choosing hyper-parameters), spread evenly over the specialties, each from its own stream
  (`eval_draw.py`: seed + EVAL_SEED_OFFSET, each question once); deterministic. A specialty whose split has fewer
  distinct questions than its share of the eval is one `UserError` line naming the entry.
- `allows(ref)`: a peer's reference names an accepted (dataset, options) pair (`accept`, by default the mix, may
  be wider) with an index in bounds. Held-out questions are refused after regeneration (`is_heldout`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swarm_node import variants
from swarm_node.errors import ConfigError, UserError
from swarm_node.tasks import heldout
from swarm_node.tasks.eval_draw import EVAL_SEED_OFFSET, SplitStream
from swarm_node.tasks.formats import ANSWER_LINE, PromptFormat
from swarm_node.tasks.pass_rates import PassRateBook
from swarm_node.tasks.reference import (
    DATASET_SIZE,
    DEFAULT_TASK,
    TaskInstance,
    TaskRef,
    canonical_config,
    dataset,
    instance,
    resolve_options,
    score,
)
from swarm_node.tasks.selection import TASK_SELECTIONS, reads_rates

# A dataset whose problems are almost all held out cannot feed training: stop looking.
MAX_SCAN = 10_000

# Reward modes over reasoning-gym's score_answer. "exact" (default): 1 when the verifier says fully right, else 0.
# reasoning-gym gives partial credit when the true answer is a substring of ours ("-6" for 6 scores 0.5), and
# GRPO's normalisation turns that into a full positive advantage in an all-wrong group: training then teaches
# sign errors (measured: docs/MEASUREMENTS.md).
REWARD_MODES: variants.Registry[Callable[[float], float]] = variants.Registry("task.reward", variants.REWARD_MODES)
REWARD_MODES.add("exact", lambda raw: 1.0 if raw >= 1.0 else 0.0)
REWARD_MODES.add("score", lambda raw: raw)

_MIX_KEYS = ("name", "options", "weight")


@dataclass(frozen=True)
class Specialty:
    """One dataset of a mix: its name, canonical options (JSON) and draw weight."""

    name: str
    config: str
    weight: float = 1.0


def parse_specialties(entries: Sequence[Mapping[str, Any]], what: str = "task.mix",
                      weighted: bool = True) -> tuple[Specialty, ...]:
    """Config entries `{name, options, weight}` as specialties; a malformed entry is one ConfigError line naming it.
    `weighted` False (an accept list): no weight key, and the same name may come with other options."""
    keys = _MIX_KEYS if weighted else _MIX_KEYS[:2]
    out: list[Specialty] = []
    for i, entry in enumerate(entries):
        where = f"{what}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a table like {{name = \"chain_sum\", options = {{}}}}, got {entry!r}")
        unknown = sorted(set(entry) - set(keys))
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(keys)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where} needs a dataset name (name = \"chain_sum\"), got {name!r}")
        options = entry.get("options", {})
        if not isinstance(options, Mapping):
            raise ConfigError(f"{where} ({name!r}): options must be a table, got {options!r}")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf"):
            raise ConfigError(f"{where} ({name!r}): weight must be a number > 0, got {weight!r}")
        spec = Specialty(name, canonical_config(resolve_options(name, dict(options))), float(weight))
        if weighted and any(s.name == name for s in out):
            raise ConfigError(f"{what}: dataset {name!r} appears twice; give each dataset one entry")
        out.append(spec)
    return tuple(out)


def _build(spec: Specialty, seed: int, size: int, where: str) -> None:
    """Build the dataset now (not at the first draw), so bad names and options fail at once, naming the entry."""
    try:
        dataset(spec.name, spec.config, seed, size)
    except UserError as exc:
        raise UserError(f"{where}{exc}") from exc


class TaskSource:
    """Draws task references over a mix for one seed, regenerates and scores instances, keeps eval apart."""

    def __init__(self, name: str = DEFAULT_TASK, options: dict[str, Any] | None = None, seed: int = 0,
                 size: int = DATASET_SIZE, reward: str = "exact", selection: str = "uniform",
                 mix: Sequence[Mapping[str, Any]] | None = None,
                 accept: Sequence[Mapping[str, Any]] | None = None) -> None:
        if reward not in REWARD_MODES:
            raise UserError(f"unknown reward mode {reward!r}; choose {', '.join(REWARD_MODES)}")
        if selection not in TASK_SELECTIONS:
            raise UserError(f"unknown task selection {selection!r}; choose {', '.join(TASK_SELECTIONS)}")
        self.reward_mode = reward
        self.selection = selection
        self.select = TASK_SELECTIONS[selection]
        self.reads_rates = reads_rates(self.select)  # whether draws read `book`
        self.seed = seed
        self.size = size
        if mix:
            self.mix = parse_specialties(mix)
            for i, spec in enumerate(self.mix):
                _build(spec, seed, size, f"task.mix[{i}]: ")
        else:
            self.mix = (Specialty(name, canonical_config(resolve_options(name, options))),)
            _build(self.mix[0], seed, size, "")
        accepted = parse_specialties(accept, "task.accept", weighted=False) if accept else self.mix
        for i, spec in enumerate(accepted if accept else ()):
            _build(spec, seed, size, f"task.accept[{i}]: ")
        self.accepted: frozenset[tuple[str, str]] = frozenset((s.name, s.config) for s in accepted)
        # A single task's name, options and config (the first specialty of a mix).
        self.name = self.mix[0].name
        self.config = self.mix[0].config
        self.options: dict[str, Any] = json.loads(self.config)
        self.names = tuple(s.name for s in self.mix)
        self.weights = tuple(s.weight for s in self.mix)
        self.turn = 0  # prompts drawn so far (a rotating selection's position when the caller gives none)
        self.book = PassRateBook()  # pass-rate estimates (the adaptive selection's; checkpointed with the streams)
        self._eval: dict[tuple[str, str], SplitStream] = {}  # (split, dataset) -> its eval stream so far

    def draw(self, rng: random.Random, count: int, turn: int | None = None) -> list[TaskRef]:
        """`count` training references; `turn` (default: this source's own count) positions a rotating selection."""
        start = self.turn if turn is None else turn
        picks = self.select(rng, self.weights, self.size, count, start, _BookRates(self))
        self.turn = start + count
        return [self._training_ref(self.mix[s], i) for s, i in picks]

    def rate(self, ref: TaskRef) -> float:
        """The estimated pass rate of a training reference (its instance's, else its family's)."""
        return self.book.rate(ref)

    def _training_ref(self, spec: Specialty, index: int) -> TaskRef:
        ref = TaskRef(spec.name, spec.config, self.seed, index)
        if not self.is_heldout(instance(ref, self.size)):
            return ref
        key = hashlib.sha256(f"redraw\0{spec.name}\0{spec.config}\0{self.seed}\0{index}".encode()).digest()
        redraw = random.Random(int.from_bytes(key[:8], "big"))
        for _ in range(MAX_SCAN):
            ref = TaskRef(spec.name, spec.config, self.seed, redraw.randrange(self.size))
            if not self.is_heldout(instance(ref, self.size)):
                return ref
        raise UserError(f"task {spec.name!r}: no training problem found in {MAX_SCAN} draws (all held out?)")

    def reward(self, inst: TaskInstance, completion_text: str, fmt: PromptFormat = ANSWER_LINE) -> float:
        """A completion's correctness: reasoning-gym's score of the answer `fmt` extracts, under this source's
        reward mode."""
        return REWARD_MODES[self.reward_mode](score(inst, completion_text, fmt, self.size))

    def eval_refs(self, count: int, split: str = heldout.DEFAULT_SPLIT) -> list[TaskRef]:
        """`count` distinct questions of a held-out split, spread evenly over the mix (the first specialties get the
        remainder)."""
        if split not in heldout.SPLITS:
            raise UserError(f"unknown eval split {split!r}; choose one of {', '.join(heldout.SPLITS)}")
        n = len(self.mix)
        out: list[TaskRef] = []
        for j, spec in enumerate(self.mix):
            out.extend(self._eval_stream(spec, split).take(count // n + (j < count % n)))
        return out

    def _eval_stream(self, spec: Specialty, split: str) -> SplitStream:
        key = (split, spec.name)
        if key not in self._eval:
            self._eval[key] = SplitStream(spec.name, spec.config, split, self.seed + EVAL_SEED_OFFSET, self.size)
        return self._eval[key]

    def is_heldout(self, inst: TaskInstance) -> bool:
        """Whether an instance is held out (test or validation): never drawn for training, never trained on from a
        peer."""
        return heldout.is_heldout(inst)

    def allows(self, ref: TaskRef) -> bool:
        """Whether a peer's reference names an accepted dataset and options with an index in bounds."""
        return ((ref.dataset, ref.config) in self.accepted and 0 <= ref.index < self.size
                and 0 <= ref.seed < 2**63)


class _BookRates:
    """A source's `PassRateBook` read by position in its mix (`selection.PassRates`)."""

    def __init__(self, source: TaskSource) -> None:
        self.source = source

    def family(self, specialty: int) -> float:
        spec = self.source.mix[specialty]
        return self.source.book.family_rate(spec.name, spec.config)

    def instance(self, specialty: int, index: int) -> float:
        spec = self.source.mix[specialty]
        return self.source.book.rate(TaskRef(spec.name, spec.config, self.source.seed, index))

    def replayable(self, specialty: int) -> list[tuple[int, float]]:
        spec = self.source.mix[specialty]
        return self.source.book.replayable(spec.name, spec.config, self.source.seed)
