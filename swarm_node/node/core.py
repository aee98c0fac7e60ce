"""The node: wires model, task source, sampler, trainer, checkpoints and stats into the step loop.

One step (solo): draw B task references, sample G completions each, score them locally, compute group
advantages, drop groups without signal, run the GRPO update, push the new weights into the sampler (policy
version + 1), log metrics, checkpoint every K steps. Everything the node does is visible through `NodeStats`.

One step (peer, with an injected `sharing.Exchange`): sample I local groups, publish them, drain what peers sent
(re-scored by `sharing.accept_external`, pooled in `pool.ExperiencePool`), mix the local groups with J external
ones from the pool, train. `sample_and_share` and `mix_and_train` are the two halves, so a lockstep simulation
can let the network run between them. The node never imports a transport implementation. The pool is not
checkpointed: after a resume it refills from the swarm.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarm_node import tasks
from swarm_node.config import NodeConfig
from swarm_node.errors import UserError
from swarm_node.model import checkpoint, lora
from swarm_node.model.default_model import ensure_default_model, load_model
from swarm_node.model.tokenizer import tokenizer_hash
from swarm_node.sampler.base import PromptTooLongError, Sampler, SamplerSettings, SamplingParams
from swarm_node.sampler.factory import make_sampler
from swarm_node.sharing.corrections import external_samples
from swarm_node.sharing.exchange import Exchange, Received
from swarm_node.sharing.pool import ExperiencePool, PoolEntry
from swarm_node.sharing.rescore import ShareContext, accept_external
from swarm_node.sharing.wire import group_id_for, to_wire
from swarm_node.status.stats import NodeStats
from swarm_node.train.evaluate import EvalResult, evaluate
from swarm_node.train.overlap import LatestWeights, OverlappedGenerator
from swarm_node.train.scoring import score_group, to_samples
from swarm_node.train.staleness import drop_reason
from swarm_node.train.trainer import Trainer
from swarm_node.types import ScoredGroup

METRICS_FILE = "metrics.jsonl"


@dataclass
class NodeEvents:
    """Callbacks the CLI uses to show progress; all optional."""

    log: Callable[[str], None] = print
    build_progress: Callable[[int, int, str], None] | None = None
    on_step: Callable[[dict[str, Any]], None] | None = None


@dataclass
class RunSummary:
    steps: int
    first_reward: float | None
    last_reward: float | None
    eval: EvalResult | None
    run_dir: Path
    skipped_steps: int


def prepare_run_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"run dir {str(path)!r} is not writable: {exc.strerror or exc}") from exc


def _truncate_metrics(path: Path, last_step: int) -> None:
    """After a resume, drop metric lines for steps the checkpoint does not contain (rewritten atomically)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= last_step:
                kept.append(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


@dataclass
class Draft:
    """The first half of a step: this step's local groups, sampled, scored and (peer mode) published."""

    groups: list[ScoredGroup]
    gen_s: float
    gen_tokens: int
    started: float
    version: int  # the policy version that generated the groups


class Node:
    def __init__(self, cfg: NodeConfig, stats: NodeStats | None = None, events: NodeEvents | None = None,
                 exchange: Exchange | None = None, model_dir: Path | None = None,
                 sampler: Sampler | None = None) -> None:
        self.cfg = cfg
        self.exchange = exchange
        self.model_dir_override = model_dir  # a simulation may hand nodes different starting weights
        self.stats = stats or NodeStats()
        self.events = events or NodeEvents()
        self.run_dir = Path(cfg.run.run_dir)
        self.step = 0
        self.version = 0
        self.skipped_steps = 0
        self.sampler: Sampler | None = sampler  # given: a simulation's shared engine; else built by setup()
        self.draws = 0  # batches drawn so far: seeds the sampler (ahead of `step` when generation overlaps)
        self.overlap: OverlappedGenerator[Draft | str] | None = None
        self.latest_weights = LatestWeights()
        self._last_step_end: float | None = None
        self.stepper: Callable[[], dict[str, Any] | None] | None = None  # a role's step (echo_peer) instead
        self.peer_drops: Counter[tuple[str, str]] = Counter()  # (sender, reason), incl. forged_reward
        self.ready = False  # setup() done

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        prepare_run_dir(self.run_dir)
        torch.set_num_threads(cfg.train.threads or os.cpu_count() or 1)
        self.task_source = tasks.TaskSource(cfg.task.name, cfg.task.options, cfg.task.seed,
                                            reward=cfg.task.reward)
        self.stats.set_phase("building-model")
        if self.model_dir_override is not None:
            self.model_dir = self.model_dir_override
        elif cfg.model.path:
            self.model_dir = Path(cfg.model.path)
        else:
            self.model_dir = ensure_default_model(self.events.build_progress)
        self.model, self.tokenizer = load_model(self.model_dir)
        if cfg.train.lora_rank:
            lora.attach_lora(self.model, cfg.train.lora_rank, cfg.train.lora_alpha, seed=cfg.run.seed)
        self.trainer = Trainer(self.model, cfg.train, cfg.sampler, self.tokenizer.pad_token_id, cfg.run.seed)
        self.rng = random.Random(cfg.run.seed)
        sh = cfg.share
        self.pool = ExperiencePool(sh.pool_size, sh.per_peer_pool_cap, sh.max_external_age)
        self.share_rng = random.Random(cfg.run.seed * 7919 + 17)  # external selection, apart from task draws
        self.tokenizer_hash = tokenizer_hash(self.tokenizer)
        self.share_ctx = ShareContext(self.tokenizer, self.tokenizer_hash, self.task_source,
                                              cfg.train.advantage)
        self._restore_or_start()
        self.stats.set_phase("loading-sampler")
        s = cfg.sampler
        if self.sampler is None:
            self.sampler = make_sampler(s.kind, self.model_dir, self.model, self.tokenizer,
                                        SamplerSettings(s.threads, s.max_model_len, s.kv_cache_gb, s.max_num_seqs),
                                        self.version, self.events.log)
        if self.step > 0:
            self.sampler.load_weights(self.policy_weights(), self.version)
        self.ready = True

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The current policy in the form this node's sampler loads (see `Sampler.weights`)."""
        assert self.sampler is not None, "policy_weights() is called once setup() has built the sampler"
        if not self.cfg.train.lora_rank or self.sampler.weights == "full":
            return self.model.state_dict()
        if self.sampler.weights == "adapter":
            return lora.adapter_tensors(self.model)
        return lora.merged_state(self.model)

    def _restore_or_start(self) -> None:
        ckpt_root = self.run_dir / checkpoint.CHECKPOINT_DIR
        if not self.cfg.run.resume:
            if any(ckpt_root.glob("step-*")):
                raise UserError(f"run dir {str(self.run_dir)!r} already has checkpoints: pass --resume to "
                                "continue it, or choose another --run-dir")
            (self.run_dir / METRICS_FILE).unlink(missing_ok=True)
            return
        ckpt = checkpoint.latest_checkpoint(self.run_dir, warn=self.events.log)
        if ckpt is None:
            self.events.log("resume: no complete checkpoint found; starting from step 0")
            (self.run_dir / METRICS_FILE).unlink(missing_ok=True)
            return
        checkpoint.restore(ckpt, self.model, self.trainer.optimizer)
        self.step = self.draws = ckpt.step
        self.version = int(ckpt.state["policy_version"])
        self.skipped_steps = int(ckpt.state.get("skipped_steps", 0))
        self.trainer.optimizer_steps = int(ckpt.state.get("optimizer_steps", 0))
        self.rng.setstate(checkpoint.state_from_json(ckpt.state["task_rng"]))
        _truncate_metrics(self.run_dir / METRICS_FILE, self.step)
        self.stats.update(last_checkpoint={"step": ckpt.step, "path": str(ckpt.path)})
        self.events.log(f"resume: continuing from checkpoint step {ckpt.step} (policy version {self.version})")

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        if not self.ready:
            self.setup()
        cfg = self.cfg
        self.stats.update(total_steps=cfg.run.steps, policy_version=self.version, step=self.step)
        self.stats.set_phase("training")
        if cfg.train.max_staleness > 0 and self.stepper is None:
            self.overlap = OverlappedGenerator(self._produce_overlapped, cfg.train.max_staleness)
            self.overlap.start()
        try:
            self._loop()
        finally:
            if self.overlap is not None:
                self.overlap.stop()
                with self.overlap.lock:  # a batch still being generated finishes first
                    self._sync_sampler()
                self.overlap = None
        result = self.evaluate() if cfg.run.eval_problems else None
        self.stats.set_phase("done")
        return self.summary(result)

    def _loop(self) -> None:
        cfg = self.cfg
        with open(self.run_dir / METRICS_FILE, "a") as metrics_file:
            while self.step < cfg.run.steps:
                try:
                    metrics = self.stepper() if self.stepper is not None else self.train_one_step()
                except KeyboardInterrupt:  # Ctrl-C: keep what the finished steps learnt, then stop
                    self.events.log(f"interrupted: saving a checkpoint at step {self.step}")
                    self.save_checkpoint()
                    raise
                if metrics is None:
                    continue
                metrics_file.write(json.dumps(metrics) + "\n")
                metrics_file.flush()
                if self.step % cfg.run.checkpoint_every == 0 or self.step == cfg.run.steps:
                    self.save_checkpoint()
                if cfg.run.eval_every and self.step % cfg.run.eval_every == 0 and self.step < cfg.run.steps:
                    self.events.log(f"eval at step {self.step}: {self.evaluate()}")

    def generate_groups(self) -> tuple[list[ScoredGroup], float, int]:
        """Sample and score this step's local groups: (groups, seconds, generated tokens)."""
        cfg = self.cfg
        count = cfg.share.local_groups or cfg.run.prompts_per_step
        insts = [tasks.instance(r) for r in self.task_source.draw(self.rng, count)]
        prompts = [self.tokenizer.encode(i.prompt) for i in insts]
        params = SamplingParams(cfg.sampler.temperature, cfg.sampler.top_p, cfg.sampler.max_new_tokens,
                                seed=cfg.run.seed * 1_000_003 + self.draws)
        self.draws += 1
        started = time.monotonic()
        try:
            outputs = self.sampler.generate(prompts, cfg.run.group_size, params)
        except PromptTooLongError as exc:
            raise UserError(f"task {cfg.task.name!r}: {exc}") from exc
        seconds = time.monotonic() - started
        groups = [score_group(i, p, out, self.task_source.reward, cfg.train.advantage)
                  for i, p, out in zip(insts, prompts, outputs, strict=True)]
        tokens = sum(len(c.token_ids) for out in outputs for c in out)
        return groups, seconds, tokens

    def train_one_step(self) -> dict[str, Any] | None:
        """One step's metrics; None when generation overlaps and the batch was too stale to train on."""
        if self.overlap is None:
            draft = self.sample_and_share()
            return draft if isinstance(draft, dict) else self.mix_and_train(draft)
        item = self.overlap.get()
        try:
            if isinstance(item, str):
                return self._skip_step(item)
            reason = drop_reason(self.version, item.version, self.cfg.train.max_staleness)
            if reason is not None:  # cannot happen with the generator's permits; the bound is enforced anyway
                self.stats.count("dropped", reason, len(item.groups))
                return None
            return self.mix_and_train(item)
        finally:
            self.overlap.done()

    def _produce_overlapped(self) -> Draft | str:
        """Generator thread: take the newest policy into the sampler, then draft one batch."""
        newer = self.latest_weights.newer_than(self.sampler.version)
        if newer is not None:
            self.sampler.load_weights(*newer)
        return self._draft()

    def _sync_sampler(self) -> None:
        newer = self.latest_weights.newer_than(self.sampler.version)
        if newer is not None:
            self.sampler.load_weights(*newer)

    def sample_and_share(self) -> Draft | dict[str, Any]:
        """Sample and score local groups and publish them; a skipped step's metrics if sampling failed."""
        draft = self._draft()
        return self._skip_step(draft) if isinstance(draft, str) else draft

    def _draft(self) -> Draft | str:
        """This step's local groups, sampled, scored and published; the reason if the batch is unusable."""
        step_started = time.monotonic()
        version = self.sampler.version
        try:
            groups, gen_s, gen_tokens = self.generate_groups()
        except FloatingPointError as exc:
            return f"non-finite reward ({exc})"
        self.stats.count("groups", "produced", len(groups))
        if self.exchange is not None:
            now = time.time()
            family = str(getattr(self.model.config, "model_type", ""))
            self.exchange.publish([
                to_wire(g, self.exchange.peer_id, version, self.tokenizer_hash, family, now,
                                group_id_for(self.exchange.peer_id, self.draws, i, self.cfg.run.seed))
                for i, g in enumerate(groups)])
        return Draft(groups, gen_s, gen_tokens, step_started, version)

    def ingest(self, received: list[Received]) -> dict[str, int]:
        """Re-score received groups into the pool; returns this step's drop counts by reason."""
        dropped: dict[str, int] = {}

        def drop(sender: str, reason: str) -> None:
            dropped[reason] = dropped.get(reason, 0) + 1
            self.stats.count("dropped", reason)
            self.peer_drops[(sender, reason)] += 1

        now = time.time()
        for item in received:
            if item.group is None:
                drop(item.sender, item.reason)
                self.stats.count_peer_message(item.sender, accepted=False)
                continue
            self.stats.count("groups", "received")
            outcome = accept_external(item.group, item.sender, self.share_ctx, now)
            if outcome.forged_reward:
                self.stats.count("errors", "forged_reward")
                self.peer_drops[(item.sender, "forged_reward")] += 1
            self.stats.count_peer_message(item.sender, accepted=outcome.external is not None
                                          and not outcome.forged_reward)
            if outcome.external is None:
                drop(item.sender, outcome.reason)
                continue
            ext = outcome.external
            for sender, reason in self.pool.add(PoolEntry(ext.group, item.sender, ext.key, self.step,
                                                          ext.retokenized)):
                drop(sender, reason)
        for sender, reason in self.pool.expire(self.step):
            drop(sender, reason)
        self.stats.update(pool_size=len(self.pool))
        return dropped

    def mix_and_train(self, draft: Draft) -> dict[str, Any]:
        """Mix I local groups with J external ones from the pool and run one GRPO update."""
        cfg = self.cfg
        groups = draft.groups
        peer_mode = self.exchange is not None
        received = self.exchange.drain() if peer_mode else []
        ext_dropped = self.ingest(received) if peer_mode else {}
        externals = self.pool.take(cfg.share.external_groups, cfg.share.selection, self.share_rng,
                                   cfg.share.per_peer_batch_cap)
        rewards = [r for g in groups for r in g.rewards]
        used = [g for g in groups if g.has_signal]
        self.stats.count("dropped", "zero_advantage", len(groups) - len(used))
        self.stats.count("groups", "used", len(used) + len(externals))
        # Version lag of each group (0 in the sequential loop, <= max_staleness when generation overlaps or the
        # groups come from workers): lag > 0 trains with the truncated importance weight.
        lags = [self.version - g.version for g in groups]
        for g, lag in zip(groups, lags, strict=True):
            # Other processes' log-probs (a learner's workers) are never the ratio's reference: untrusted, and
            # from the published policy, not ours; they only enter the truncated weight min(pi/mu, is_cap).
            g.off_policy = lag > 0 or g.source != "local"
            if g.has_signal:
                self.stats.count("staleness", lag, len(g.completions))
        self.stats.update(pool_size=len(self.pool))
        train_started = time.monotonic()
        samples = to_samples(used) + external_samples(self.trainer, externals, cfg.share.external_correction,
                                                              cfg.share.is_cap)
        result = self.trainer.train_step(samples)
        train_s = time.monotonic() - train_started
        if result.skipped_minibatches:
            self.stats.count("errors", "nonfinite_loss", result.skipped_minibatches)
        if result.minibatches > result.skipped_minibatches:
            self.version += 1
            if self.overlap is not None or self.stepper is not None:  # the sampler is in use elsewhere, or idle
                self.latest_weights.put(self.policy_weights(), self.version)
            else:
                self.sampler.load_weights(self.policy_weights(), self.version)
        self.step += 1
        metrics = {
            "step": self.step, "policy_version": self.version, "lag": max(lags, default=0),
            "reward_mean": sum(rewards) / len(rewards),
            "accuracy": sum(g.accuracy for g in groups) / len(groups),
            "groups_used": len(used), "groups_total": len(groups),
            "loss": result.loss, "clip_frac": result.clip_frac, "kl": result.kl, "entropy": result.entropy,
            "grad_norm": result.grad_norm, "skipped_minibatches": result.skipped_minibatches,
            "tokens_per_s": draft.gen_tokens / draft.gen_s if draft.gen_s > 0 else 0.0,
            "gen_s": draft.gen_s, "train_s": train_s, "step_s": self._step_seconds(draft),
            "time": time.time(),
        }
        if peer_mode:
            ext_rewards = [r for e in externals for r in e.group.rewards]
            metrics.update({
                "external_used": len(externals),
                "external_sources": sorted({e.sender for e in externals}),
                "external_reward_mean": sum(ext_rewards) / len(ext_rewards) if ext_rewards else None,
                "pool_size": len(self.pool), "received": len(received), "external_dropped": ext_dropped,
            })
        self._publish(metrics)
        return metrics

    def _step_seconds(self, draft: Draft) -> float:
        """Sequential: from the start of sampling. Overlapped: since the previous step ended (what a step costs)."""
        now = time.monotonic()
        since = draft.started if self.overlap is None or self._last_step_end is None else self._last_step_end
        self._last_step_end = now
        return now - since

    def _skip_step(self, reason: str) -> dict[str, Any]:
        self.skipped_steps += 1
        self.step += 1
        self.stats.count("errors", "skipped_step", 1)
        self.events.log(f"step {self.step} skipped: {reason}")
        metrics = {"step": self.step, "policy_version": self.version, "skipped": reason, "time": time.time()}
        self._publish(metrics)
        return metrics

    def _publish(self, metrics: dict[str, Any]) -> None:
        self.stats.record_step(metrics)
        if self.events.on_step is not None:
            self.events.on_step(metrics)

    # -- checkpoints, eval, summary ------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        state = {"policy_version": self.version, "skipped_steps": self.skipped_steps,
                 "optimizer_steps": self.trainer.optimizer_steps,
                 "task_rng": checkpoint.state_to_json(self.rng.getstate()), "config": self.cfg.to_dict()}
        try:
            path = checkpoint.save_checkpoint(self.run_dir, self.step, self.model, self.trainer.optimizer, state,
                                              keep=self.cfg.run.keep_checkpoints)
        except checkpoint.CheckpointError as exc:
            self.stats.count("errors", "checkpoint_failed", 1)
            self.events.log(f"warning: {exc}")
            return
        self.stats.update(last_checkpoint={"step": self.step, "path": str(path), "time": time.time()})

    def evaluate(self) -> EvalResult:
        """Held-out eval of the newest policy (with the generator paused when generation overlaps)."""
        self.stats.set_phase("evaluating")
        with self.overlap.lock if self.overlap is not None else contextlib.nullcontext():
            self._sync_sampler()
            result = evaluate(self.sampler, self.tokenizer, self.task_source, self.cfg.run.eval_problems,
                              self.cfg.sampler.max_new_tokens)
        self.stats.set_phase("training")
        return result

    def summary(self, result: EvalResult | None) -> RunSummary:
        rewards = []
        path = self.run_dir / METRICS_FILE
        if path.exists():
            rewards = [m["reward_mean"] for m in map(json.loads, path.read_text().splitlines())
                       if "reward_mean" in m]
        window = max(1, min(10, len(rewards) // 4))
        first = sum(rewards[:window]) / window if rewards else None
        last = sum(rewards[-window:]) / window if rewards else None
        return RunSummary(self.step, first, last, result, self.run_dir, self.skipped_steps)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
