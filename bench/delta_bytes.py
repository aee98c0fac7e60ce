"""Bytes per policy update, full fp32 vs dense bf16 delta vs top-k, and reward at equal steps for each encoding.

Part 1, bytes (`models`): for the embedded default model and a larger random Qwen2 (bench.sampler's ~23M-parameter
recipe), a learner runs real GRPO steps (swarm_node.train.trainer.Trainer, swarm_node.config defaults, HF sampler) and
after each step every encoding publishes the new weights (`delta.PolicyPublisher`) while a follower applies the
update (`delta.PolicyFollower`, every check on). Reported per encoding: median payload bytes over the updates,
median publish and apply milliseconds, and whether the follower's state hash equalled the publisher's after every
update. The larger model is random, so the task reward is 0 everywhere and GRPO would have no signal: its steps
use a shaped reward (fraction of digit characters in the completion) and 4 prompts per step (not 16) to fit the
time budget; payload sizes depend only on the shapes, and the steps are still real Trainer updates.

Part 2, reward (`reward_at_equal_steps`): on the default model, one learner per encoding trains W_train for
`--steps` steps while its rollouts are sampled from W_pub, the policy its followers hold (what ECHO-2 workers
sample from); same seed, tasks and sampling seeds for every encoding. Reported: mean sampled reward over the last
10 steps (and the first 10), the mean KL(W_train || W_pub) drift on sampled tokens and clip fraction that the
trainer measures (how far the sampling policy lags), and the final hash agreement. "full" is the no-compression
reference (W_pub == W_train). The top-k default fraction is picked from the `--fractions` runs. Rollouts are
trained as on-policy samples (the ratio is taken against W_pub's log-probs, clipped), as a learner would do.

One torch thread (the machine is shared). Writes bench/results/delta_bytes.json, prints one summary line.

    python -m bench.delta_bytes [--steps 40] [--byte-steps 5] [--large-steps 3] [--fractions 0.01 0.05 0.1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bench import provenance
from bench.load_guard import add_loaded_flag
from bench.sampler import LARGE_RECIPE, random_model
from swarm_node import tasks
from swarm_node.config import NodeConfig
from swarm_node.model.default_model import ensure_default_model, load_model
from swarm_node.policy_sync.codecs import TopKCodec
from swarm_node.policy_sync.delta import PolicyFollower, PolicyPublisher, State, model_state
from swarm_node.sampler.base import SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.train.scoring import score_group, to_samples
from swarm_node.train.trainer import StepStats, Trainer

RESULTS = Path(__file__).parent / "results" / "delta_bytes.json"
WINDOW = 10  # steps averaged for "reward over the last steps"
STALENESS = range(1, 11)  # dense policies this many versions old: the reference for top-k's weight lag
PICK_STALENESS = 4  # top-k must lag no more than a dense policy this stale (ECHO-2: staleness <= 6 was stable)
LARGE_PROMPTS = 4
SEED = 0

RewardFn = Callable[[tasks.TaskInstance, str, tasks.PromptFormat], float]


def digit_reward(inst: tasks.TaskInstance, text: str, fmt: tasks.PromptFormat = tasks.ANSWER_LINE) -> float:
    """Shaped reward for the random larger model: the fraction of digits (signal where exact answers have none)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


@dataclass
class StepResult:
    reward: float
    stats: StepStats


class Learner:
    """W_train with its trainer, and a sampler that draws rollouts from whatever policy `step` is given."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: NodeConfig,
                 reward: RewardFn | None = None) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.trainer = Trainer(model, cfg.train, cfg.sampler, tokenizer.pad_token_id, cfg.run.seed)
        self.sampler = HFSampler(model, tokenizer)
        self.source = cfg.task.build_source()
        self.reward = reward or self.source.reward
        self.rng = random.Random(cfg.run.seed)
        self.steps = 0

    def step(self, policy: State) -> StepResult:
        """Sample from `policy`, score, train W_train on the groups with signal (as Node.mix_and_train does)."""
        cfg = self.cfg
        self.sampler.load_weights(policy, self.steps)
        insts = [tasks.instance(r) for r in self.source.draw(self.rng, cfg.run.prompts_per_step)]
        prompts = [self.tokenizer.encode(i.prompt) for i in insts]
        params = SamplingParams(*cfg.sampler.temperature_top_p(), cfg.sampler.max_new_tokens,
                                seed=cfg.run.seed * 1_000_003 + self.steps)
        outputs = self.sampler.generate(prompts, cfg.run.group_size, params)
        groups = [score_group(i, p, o, self.reward, cfg.train.advantage, eos_id=self.tokenizer.eos_token_id,
                              special_ids=frozenset(self.tokenizer.all_special_ids))
                  for i, p, o in zip(insts, prompts, outputs, strict=True)]
        stats = self.trainer.train_step(to_samples([g for g in groups if g.has_signal]))
        self.steps += 1
        rewards = [r for g in groups for r in g.rewards]
        return StepResult(sum(rewards) / len(rewards), stats)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def bytes_per_update(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: NodeConfig, steps: int,
                     encodings: dict[str, dict[str, Any]], reward: RewardFn | None = None) -> dict[str, Any]:
    """Every encoding publishes the same W_train after each of `steps` real steps (rollouts from W_train)."""
    learner = Learner(model, tokenizer, cfg, reward)
    w0 = model_state(model)
    pubs = {name: PolicyPublisher(w0, encoding=opts["encoding"], **opts["options"]) for name, opts in encodings.items()}
    followers = {name: PolicyFollower(w0) for name in encodings}
    sizes: dict[str, list[int]] = {n: [] for n in encodings}
    publish_s: dict[str, list[float]] = {n: [] for n in encodings}
    apply_s: dict[str, list[float]] = {n: [] for n in encodings}
    agree = {n: True for n in encodings}
    for _ in range(steps):
        learner.step(model_state(model))
        train = model_state(model)
        for name, pub in pubs.items():
            started = time.perf_counter()
            update = pub.publish(train)
            publish_s[name].append(time.perf_counter() - started)
            started = time.perf_counter()
            followers[name].apply(update)
            apply_s[name].append(time.perf_counter() - started)
            sizes[name].append(update.size)
            agree[name] &= followers[name].state_sha256 == pub.state_sha256
    params = sum(t.numel() for t in w0.values())
    out: dict[str, Any] = {"params": params, "tensors": len(w0), "updates": steps,
                           "snapshot_bytes": pubs[next(iter(pubs))].snapshot().size}
    for name in encodings:
        key = {"full": "full_fp32"}.get(name, name).replace("-", "_").replace("@", "_at_")
        out[f"{key}_bytes"] = int(statistics.median(sizes[name]))
        out[f"{key}_bytes_per_param"] = round(statistics.median(sizes[name]) / params, 4)
        out[f"{key}_publish_ms"] = ms(statistics.median(publish_s[name]))
        out[f"{key}_apply_ms"] = ms(statistics.median(apply_s[name]))
        out[f"{key}_hash_agreement"] = agree[name]
    return out


def weight_distance(a: State, b: State) -> float:
    return sum(float((a[n] - b[n]).double().norm() ** 2) for n in a) ** 0.5


def reward_run(model_dir: Path, cfg: NodeConfig, steps: int, encoding: str, options: dict[str, Any]
               ) -> dict[str, Any]:
    """Train W_train for `steps` steps with rollouts sampled from W_pub of this encoding."""
    torch.manual_seed(SEED)
    model, tokenizer = load_model(model_dir)
    learner = Learner(model, tokenizer, cfg)
    w0 = model_state(model)
    pub = PolicyPublisher(w0, encoding=encoding, **options)
    follower = PolicyFollower(w0)
    rewards, kls, clips, sizes = [], [], [], []
    history = [w0]  # the last W_train states: how far a dense policy S versions old would be
    agree = True
    for _ in range(steps):
        result = learner.step(pub.published_state())
        rewards.append(result.reward)
        kls.append(result.stats.kl)
        clips.append(result.stats.clip_frac)
        update = pub.publish(model_state(model))
        follower.apply(update)
        agree &= follower.state_sha256 == pub.state_sha256
        sizes.append(update.size)
        history = (history + [model_state(model)])[-(max(STALENESS) + 1):]
    train, published = history[-1], pub.published_state()
    moved = weight_distance(train, w0)
    return {"reward_last": round(statistics.fmean(rewards[-WINDOW:]), 4),
            "reward_first": round(statistics.fmean(rewards[:WINDOW]), 4),
            # median: the k3 estimate on sampled tokens has rare huge outliers (a token W_pub found unlikely)
            "drift_kl_median": round(statistics.median(kls), 6), "clip_frac_mean": round(statistics.fmean(clips), 4),
            "bytes_per_update": int(statistics.median(sizes)), "hash_agreement": agree,
            "final_weight_lag": round(weight_distance(train, published) / moved, 4),
            "stale_dense_weight_lag": {s: round(weight_distance(train, history[-1 - s]) / moved, 4)
                                       for s in STALENESS if s < len(history)},
            "rewards": [round(r, 4) for r in rewards]}


def pick_fraction(runs: dict[str, dict[str, Any]], fractions: list[float]) -> float:
    """The smallest fraction whose W_pub lags W_train no more than a dense policy PICK_STALENESS versions old
    (relative weight distance at the end of the run, reference from the "full" run) and whose last-window reward
    is within one binomial standard error of "full" or better; the largest fraction if none qualifies."""
    ref = runs["full"]
    samples = WINDOW * NodeConfig().run.prompts_per_step * NodeConfig().run.group_size
    tolerance = (max(ref["reward_last"] * (1 - ref["reward_last"]), 1e-4) / samples) ** 0.5
    for fraction in sorted(fractions):
        run = runs[f"topk@{fraction}"]
        if (run["final_weight_lag"] <= ref["stale_dense_weight_lag"][PICK_STALENESS]
                and run["reward_last"] >= ref["reward_last"] - tolerance):
            return fraction
    return max(fractions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps per encoding for the reward part")
    parser.add_argument("--byte-steps", type=int, default=5, help="updates measured on the default model")
    parser.add_argument("--large-steps", type=int, default=3, help="updates measured on the larger model")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.05, 0.1])
    parser.add_argument("--default-fraction", type=float, default=TopKCodec.topk_fraction,
                        help="the top-k fraction reported as 'topk' (default: the codec's default)")
    add_loaded_flag(parser)
    args = parser.parse_args()
    run = provenance.begin(timed=True, loaded=args.loaded)  # publish and apply times
    args.fractions = sorted(set(args.fractions) | {args.default_fraction})
    torch.set_num_threads(1)
    started = time.monotonic()
    # The char-answer-line-v1 model (the default until November 2026) and its budget: this bench prompts in answer-line.
    cfg = NodeConfig().with_values({"run.seed": SEED, "sampler.max_new_tokens": 8})
    encodings = {"full": {"encoding": "full", "options": {}},
                 "dense-bf16": {"encoding": "dense-bf16", "options": {}},
                 "topk": {"encoding": "topk", "options": {"topk_fraction": args.default_fraction}},
                 **{f"topk@{f}": {"encoding": "topk", "options": {"topk_fraction": f}} for f in args.fractions}}

    default_dir = ensure_default_model(recipe="char-answer-line-v1")
    model, tokenizer = load_model(default_dir)
    models = {"default": {"path": str(default_dir),
                          **bytes_per_update(model, tokenizer, cfg, args.byte_steps, encodings)}}
    print(f"  default: {models['default']}", flush=True)
    large_cfg = NodeConfig().with_values({"run.seed": SEED, "run.prompts_per_step": LARGE_PROMPTS,
                                          "sampler.max_new_tokens": 8})
    with tempfile.TemporaryDirectory() as tmp:
        name, large, large_tok, _ = random_model("larger-random", LARGE_RECIPE, Path(tmp))
    models["larger"] = {"recipe": "bench.sampler.LARGE_RECIPE (random weights)", "reward": "digit fraction",
                        "prompts_per_step": LARGE_PROMPTS,
                        **bytes_per_update(large, large_tok, large_cfg, args.large_steps, encodings, digit_reward)}
    print(f"  larger: {models['larger']}", flush=True)
    del large

    runs: dict[str, dict[str, Any]] = {}
    for name in ["full", "dense-bf16", *(f"topk@{f}" for f in args.fractions)]:
        t0 = time.monotonic()
        runs[name] = reward_run(default_dir, cfg, args.steps, encodings[name]["encoding"], encodings[name]["options"])
        print(f"  reward {name}: last {runs[name]['reward_last']} first {runs[name]['reward_first']} "
              f"kl {runs[name]['drift_kl_median']} lag {runs[name]['final_weight_lag']} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    picked = pick_fraction(runs, args.fractions)
    default_topk = runs[f"topk@{args.default_fraction}"]
    result = {
        "models": models,
        "reward_at_equal_steps": {
            "steps": args.steps, "window": WINDOW, "full": runs["full"]["reward_last"],
            "dense-bf16": runs["dense-bf16"]["reward_last"], "topk": default_topk["reward_last"],
            "topk_fraction": args.default_fraction,
            "hash_agreement": all(r["hash_agreement"] for r in runs.values()),
            "per_encoding": runs,
        },
        "topk_fraction_picked": picked, "pick_rule": " ".join((pick_fraction.__doc__ or "").split()),
        "pick_staleness": PICK_STALENESS,
        "threads": 1, "seed": SEED, "wall_s": round(time.monotonic() - started, 1),
    }
    result = provenance.stamp(result, run, runs=None)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    d, lg, rw = models["default"], models["larger"], result["reward_at_equal_steps"]
    print(f"delta_bytes: default {d['params']:,} params: full {d['full_fp32_bytes']:,} B, dense-bf16 "
          f"{d['dense_bf16_bytes']:,} B, topk@{args.default_fraction} {d['topk_bytes']:,} B | larger "
          f"{lg['params']:,}: {lg['full_fp32_bytes']:,} / {lg['dense_bf16_bytes']:,} / {lg['topk_bytes']:,} B | "
          f"reward last "
          f"{WINDOW} of {args.steps} steps: full {rw['full']:.3f}, dense-bf16 {rw['dense-bf16']:.3f}, "
          f"topk {rw['topk']:.3f} | hashes agree: {rw['hash_agreement']} | picked topk_fraction {picked} | "
          f"{result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
