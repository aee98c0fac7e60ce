"""Malicious node kinds for the simulations: what each attacker forges and sends, registered by name (`ATTACKS`).

Contract: an attacker does not train. Each round its `Attack` forges `per_round` groups with `forge(ctx, rng,
signer, now, seen)` and publishes them signed by its current identity (`signer`); `seen` holds the wire groups it
received from others (what a replay copies). Every forged group is shaped to pass as much of the receiver's
checks as the attack allows (our tokenizer hash, accepted tasks on our seed, valid log-probs, exactly our group
size), so that the defence under test is the one that has to catch it:
- "forged_reward": half right, half wrong answers, every claimed reward inverted (caught: re-scoring; the group
  may still be used, with OUR rewards, never the claimed ones);
- "oov_tokens": garbage: token ids past the vocabulary (half the groups) or random in-vocabulary ids (the rest);
- "over_length": the right answer followed by filler to the wire's maximum (4096 ids per completion);
- "junk": verifier-passing junk: the right answer on the first line then junk, or padded with spaces, beside
  wrong well-formed answers (caught only by the well-formed defence, `share.require_well_formed`);
- "stale": a flood of honest-looking groups created past the receivers' max age;
- "replay": other peers' groups re-sent as its own (re-attributed, new group ids: only content dedup catches them);
- "sybil": the junk attack under a fresh identity every `rotate_rounds` rounds.
`ForgeContext.from_assembly(assembly)` takes what an attacker must know of its victims from any honest node of the swarm
(tokenizer, task source, bounds). Pure apart from the random stream passed in.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from simulations import variants
from swarm_node import tasks
from swarm_node.variants import Registry

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from swarm_node.config import NodeConfig
    from swarm_node.node.assembly import Assembly

WIRE_MAX_TOKENS = 4096  # protocol.limits.Limits.max_tokens_per_completion: what passes the wire
JUNK = string.ascii_letters + string.digits + "!?#%&*+<>=@"


@dataclass(frozen=True)
class ForgeContext:
    """What an attacker knows of the swarm it attacks (any honest node tells it all)."""

    tokenizer: PreTrainedTokenizerBase
    tokenizer_hash: str
    family: str
    source: tasks.TaskSource
    group_size: int
    max_new_tokens: int
    vocab_size: int
    max_age_s: float

    @classmethod
    def from_assembly(cls, assembly: Assembly) -> ForgeContext:
        """What an honest node's assembly (a SAPO peer: its share context) tells about the swarm."""
        node, ctx = assembly.node, assembly.context
        assert ctx is not None, "an attacker learns the swarm from a node that shares"
        cfg = node.cfg
        return cls(node.tokenizer, node.tokenizer_hash, node.family, cfg.task.build_source(), cfg.run.group_size,
                   cfg.sampler.max_new_tokens, len(node.tokenizer), ctx.max_age_s)

    @classmethod
    def from_config(cls, cfg: NodeConfig, model_dir: Path) -> ForgeContext:
        """What a live attacker needs: the victims' configuration and model directory (tokenizer, family)."""
        from swarm_node.model.default_model import load_tokenizer
        from swarm_node.model.tokenizer import tokenizer_hash
        from swarm_node.node.build import with_model_defaults

        cfg = with_model_defaults(cfg, model_dir)  # the victims' budget: theirs, else their model's own
        tok = load_tokenizer(model_dir)
        family = str(json.loads((model_dir / "config.json").read_text()).get("model_type", ""))
        return cls(tok, tokenizer_hash(tok), family, cfg.task.build_source(), cfg.run.group_size,
                   cfg.sampler.max_new_tokens, len(tok), 600.0)

    @property
    def eos(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def completion(self, text: str, claimed: float, ids: list[int] | None = None) -> CompletionWire:
        """A completion with valid log-probs: `text` tokenized with EOS appended, unless `ids` are given."""
        ids = ids if ids is not None else self.tokenizer.encode(text) + [self.eos]
        return CompletionWire(tuple(ids), text, tuple(-1.0 for _ in ids), claimed)

    def group(self, signer: str, ref: tasks.TaskRef, completions: list[CompletionWire], created_at: float,
              rng: random.Random) -> RolloutGroup:
        return RolloutGroup(rng.randbytes(16), signer, 0, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                            tuple(completions), self.tokenizer_hash, self.family, created_at)

    def problems(self, rng: random.Random, count: int) -> list[tasks.TaskInstance]:
        return [tasks.instance(r) for r in self.source.draw(rng, count, turn=rng.randrange(1 << 30))]


def wrong(answer: str) -> str:
    return answer + "7"  # never equal to the answer; exact match scores it 0


Forge = Callable[[ForgeContext, random.Random, str, float, list[RolloutGroup]], list[RolloutGroup]]


@dataclass(frozen=True)
class Attack:
    forge: Forge  # one group per call: (ctx, rng, signer, now, seen) -> groups
    per_round: int = 4  # calls per round
    rotate_rounds: int = 0  # > 0: a fresh identity every this many rounds (a Sybil)


ATTACKS: Registry[Attack] = Registry("attack", variants.ATTACKS)


def _half(ctx: ForgeContext) -> int:
    return ctx.group_size // 2


def forged_reward(ctx: ForgeContext, rng: random.Random, signer: str, now: float,
                  seen: list[RolloutGroup]) -> list[RolloutGroup]:
    inst = ctx.problems(rng, 1)[0]
    right = [ctx.completion(inst.answer, 0.0) for _ in range(_half(ctx))]
    bad = [ctx.completion(wrong(inst.answer), 1.0) for _ in range(ctx.group_size - _half(ctx))]
    return [ctx.group(signer, inst.ref, right + bad, now, rng)]


def oov_tokens(ctx: ForgeContext, rng: random.Random, signer: str, now: float,
               seen: list[RolloutGroup]) -> list[RolloutGroup]:
    inst = ctx.problems(rng, 1)[0]
    out = []
    past = rng.random() < 0.5
    for _ in range(ctx.group_size):
        n = rng.randint(1, ctx.max_new_tokens - 1)
        ids = [rng.randrange(3, ctx.vocab_size) for _ in range(n)]
        if past:
            ids[rng.randrange(n)] = ctx.vocab_size + rng.randrange(1 << 16)
        out.append(ctx.completion("".join(rng.choice(JUNK) for _ in range(n)), 1.0, ids + [ctx.eos]))
    return [ctx.group(signer, inst.ref, out, now, rng)]


def over_length(ctx: ForgeContext, rng: random.Random, signer: str, now: float,
                seen: list[RolloutGroup]) -> list[RolloutGroup]:
    inst = ctx.problems(rng, 1)[0]
    head = ctx.tokenizer.encode(inst.answer)
    filler = ctx.tokenizer.encode(" ")
    ids = (head + filler * WIRE_MAX_TOKENS)[:WIRE_MAX_TOKENS - 1] + [ctx.eos]
    text = inst.answer + " " * (len(ids) - 1 - len(head))
    comps = [ctx.completion(text, 1.0, ids) for _ in range(_half(ctx))]
    comps += [ctx.completion(wrong(inst.answer), 0.0) for _ in range(ctx.group_size - _half(ctx))]
    return [ctx.group(signer, inst.ref, comps, now, rng)]


def junk_text(ctx: ForgeContext, answer: str, rng: random.Random) -> str:
    """The right answer, then junk (or padding) up to our generation budget: the verifier reads the first line."""
    room = max(0, ctx.max_new_tokens - 1 - len(ctx.tokenizer.encode(answer)))  # EOS takes the last id
    if rng.random() < 0.5 and room >= 2:
        return answer + "\n" + "".join(rng.choice(JUNK) for _ in range(room - 1))
    return answer + " " * room


def junk(ctx: ForgeContext, rng: random.Random, signer: str, now: float,
         seen: list[RolloutGroup]) -> list[RolloutGroup]:
    inst = ctx.problems(rng, 1)[0]
    comps = [ctx.completion(junk_text(ctx, inst.answer, rng), 1.0) for _ in range(_half(ctx))]
    comps += [ctx.completion(wrong(inst.answer), 0.0) for _ in range(ctx.group_size - _half(ctx))]
    return [ctx.group(signer, inst.ref, comps, now, rng)]


def fair(ctx: ForgeContext, rng: random.Random, signer: str, now: float,
         seen: list[RolloutGroup]) -> list[RolloutGroup]:
    """Not an attack: a valid, well-formed group with true claims (half right, half wrong), as an honest peer's.
    Live stand-ins for honest peers send these, and a flood of them is valid and distinct."""
    inst = ctx.problems(rng, 1)[0]
    comps = [ctx.completion(inst.answer, 1.0) for _ in range(_half(ctx))]
    comps += [ctx.completion(wrong(inst.answer), 0.0) for _ in range(ctx.group_size - _half(ctx))]
    return [ctx.group(signer, inst.ref, comps, now, rng)]


def stale(ctx: ForgeContext, rng: random.Random, signer: str, now: float,
          seen: list[RolloutGroup]) -> list[RolloutGroup]:
    return fair(ctx, rng, signer, now - ctx.max_age_s - 60.0, seen)


def replay(ctx: ForgeContext, rng: random.Random, signer: str, now: float,
           seen: list[RolloutGroup]) -> list[RolloutGroup]:
    if not seen:
        return []
    g = seen.pop(rng.randrange(len(seen)))
    return [RolloutGroup(rng.randbytes(16), signer, g.policy_version, g.task, g.completions, g.tokenizer_hash,
                         g.model_family, now)]


ATTACKS.add("forged_reward", Attack(forged_reward))
ATTACKS.add("oov_tokens", Attack(oov_tokens))
ATTACKS.add("over_length", Attack(over_length))
ATTACKS.add("junk", Attack(junk))
ATTACKS.add("stale", Attack(stale, per_round=32))
ATTACKS.add("replay", Attack(replay))
ATTACKS.add("sybil", Attack(junk, per_round=8, rotate_rounds=2))
