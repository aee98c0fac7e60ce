"""The node: model, task source, sampler, trainer, pool and checkpoints, driven by one loop over a rollout source.

The loop (`run(source)`): `for item in source: train_on(item)` until `run.steps`, recording each step (StepLog),
checkpointing every K steps, evaluating every E. `item` is a `Draft` (groups to train on) or a `SkippedStep`
(counted as a step, nothing trained). The default source samples on this thread (`SequentialSource`) or, with
`train.max_staleness` >= 1, on a generator thread bounded by S (`OverlappedSource`); a role may pass its own (an
ECHO-2 learner's buffer). See sources.py.

One step (solo): draw B task references, sample G completions each, score them locally, compute group
advantages, drop groups without signal, run the GRPO update, hand the new weights to the sampler (policy version
+ 1). With an injected `sharing.Exchange` (a SAPO peer): publish the local groups when drafting, and before
training drain what peers sent (the one ingest path, sharing/ingest.py, into `pool.ExperiencePool`), then mix the
local groups with J external ones from the pool. `sample_and_share()` and `mix_and_train(item)` are the two
halves with typed values, so a lockstep simulation can let the network run between them. The node never imports
a transport implementation, nor the roles. The pool is not checkpointed: after a resume it refills from the swarm.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from protocol.limits import Limits
from protocol.messages import RolloutGroup
from swarm_node import tasks
from swarm_node.config import NodeConfig
from swarm_node.errors import UserError
from swarm_node.model import checkpoint, lora
from swarm_node.model.default_model import load_model
from swarm_node.model.tokenizer import tokenizer_hash
from swarm_node.node.build import model_dir_for, sampler_settings
from swarm_node.node.hardware import Hardware
from swarm_node.node.run_files import (
    METRICS_FILE,
    NodeEvents,
    RunSummary,
    StepLog,
    prepare_run_dir,
    reward_window,
    truncate_metrics,
)
from swarm_node.node.sources import Item, OverlappedSource, RolloutSource, SequentialSource
from swarm_node.sampler.base import PromptTooLongError, Sampler, SamplingParams
from swarm_node.sampler.factory import make_sampler
from swarm_node.sharing.corrections import CorrectionParams, external_samples
from swarm_node.sharing.exchange import Exchange
from swarm_node.sharing.ingest import Ingest, PeerGuard
from swarm_node.sharing.pool import ExperiencePool, PoolEntry
from swarm_node.sharing.rescore import CompletionBounds, External, ShareContext
from swarm_node.sharing.wire import content_key, group_id_for, to_wire
from swarm_node.status.stats import NodeStats
from swarm_node.train.evaluate import EvalResult, evaluate, per_task_metrics
from swarm_node.train.overlap import LatestWeights
from swarm_node.train.scoring import score_group, to_samples
from swarm_node.train.trainer import Trainer
from swarm_node.types import Draft, ScoredGroup, SkippedStep

__all__ = ["METRICS_FILE", "Draft", "Node", "NodeEvents", "RunSummary", "SkippedStep", "prepare_run_dir"]


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
        self.source: RolloutSource | None = None  # while run() runs
        self.latest_weights = LatestWeights()
        self.step_log = StepLog(None, self.stats, self.events)  # records steps trained outside run() (simulations)
        self._last_step_end: float | None = None
        self.ready = False  # setup() done
        self.eval_before: EvalResult | None = None  # run(): the held-out eval before the first step

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        prepare_run_dir(self.run_dir)
        torch.set_num_threads(cfg.train.threads or os.cpu_count() or 1)
        self.task_source = cfg.task.build_source()
        self.stats.set_phase("building-model")
        self.model_dir = model_dir_for(cfg, self.model_dir_override, self.events.build_progress)
        # Device, precision and memory sizing (node/hardware.py), before any weights load.
        self.hardware = Hardware.prepare(cfg, self.model_dir, self.task_source, self.events.log, run_dir=self.run_dir)
        self.model, self.tokenizer = load_model(self.model_dir)
        if cfg.train.lora_rank:
            lora.attach_lora(self.model, cfg.train.lora_rank, cfg.train.lora_alpha, seed=cfg.run.seed)
        self.hardware.place(self.model)
        self.trainer = Trainer(self.model, cfg.train, cfg.sampler, self.tokenizer.pad_token_id, cfg.run.seed,
                               autocast=self.hardware.autocast)
        self.rng = random.Random(cfg.run.seed)
        sh = cfg.share
        self.pool = ExperiencePool(sh.pool_size, sh.per_peer_pool_cap, sh.max_external_age)
        self.share_rng = random.Random(cfg.run.seed * 7919 + 17)  # external selection, apart from task draws
        self.tokenizer_hash = tokenizer_hash(self.tokenizer)
        # A peer's group may cost us only what one of ours does: our group size, generation budget, context, vocabulary.
        bounds = CompletionBounds(max_completion_tokens=cfg.sampler.max_new_tokens,
                                  max_context=int(self.model.config.max_position_embeddings),
                                  vocab_size=int(self.model.config.vocab_size), group_size=cfg.run.group_size)
        self.share_ctx = ShareContext(self.tokenizer, self.tokenizer_hash, self.task_source, bounds,
                                      cfg.train.advantage, require_well_formed=sh.require_well_formed)
        # Per-peer budgets and reputation (bans kept in RUN_DIR/peers.json), shared by every ingest of this node.
        self.peer_guard = PeerGuard.from_config(cfg.peers, self.run_dir, self.stats, time.time())
        self.ingest = Ingest(self.share_ctx, self.stats, guard=self.peer_guard)
        self.family = str(getattr(self.model.config, "model_type", ""))  # what our published groups say
        self._restore_or_start()
        self.stats.set_phase("loading-sampler")
        if self.sampler is None:
            self.sampler = make_sampler(cfg.sampler.kind, self.model_dir, self.model, self.tokenizer,
                                        sampler_settings(cfg.sampler, self.hardware.sizes), self.version,
                                        self.events.log)
        if self.step > 0:
            self.sampler.load_weights(self.policy_weights(), self.version)
        self.hardware.attach(self.trainer, self.sampler)
        self.ready = True

    @property
    def peer_drops(self) -> dict[tuple[str, str], int]:
        return self.ingest.peer_drops

    def wire_limits(self) -> Limits:
        """The wire limits of every exchange a role runs for this node: token ids bounded by our vocabulary."""
        return Limits(vocab_size=len(self.tokenizer))

    def wire_groups(self, groups: list[ScoredGroup], policy_id: str, version: int, signer: str,
                    batch: int) -> list[RolloutGroup]:
        """Our groups as every role publishes them: tagged with our tokenizer and model family."""
        now = time.time()
        return [to_wire(g, policy_id, version, self.tokenizer_hash, self.family, now,
                        group_id_for(signer, batch, i, self.cfg.run.seed)) for i, g in enumerate(groups)]

    def salt(self, salt: int) -> None:
        """Draw other tasks and samples than a node with the same seed (ECHO-2 workers salt with their peer id)."""
        self.rng.seed(self.cfg.run.seed * 2**32 + salt)
        self.draws = salt << 16

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The current policy in the form this node's sampler loads (see `Sampler.weights`)."""
        assert self.sampler is not None, "policy_weights() is called once setup() has built the sampler"
        form = self.sampler.weights if self.cfg.train.lora_rank else "full"
        return lora.WEIGHT_FORMS[form](self.model)

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Install a policy someone else trained (an ECHO-2 worker's followed policy) into the sampler."""
        assert self.sampler is not None, "load_policy() is called once setup() has built the sampler"
        self.sampler.load_weights(state, version)

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
        for name, rng in (("trainer_rng", self.trainer.rng), ("share_rng", self.share_rng)):
            if name in ckpt.state:  # absent in checkpoints written before they were saved
                rng.setstate(checkpoint.state_from_json(ckpt.state[name]))
        truncate_metrics(self.run_dir / METRICS_FILE, self.step)
        self.stats.update(last_checkpoint={"step": ckpt.step, "path": str(ckpt.path)})
        self.events.log(f"resume: continuing from checkpoint step {ckpt.step} (policy version {self.version})")

    # -- the loop ------------------------------------------------------------------------------------
    def default_source(self) -> RolloutSource:
        """Sequential generation, or overlapped with training when `train.max_staleness` >= 1."""
        if self.cfg.train.max_staleness > 0:
            return OverlappedSource.start(self._produce_overlapped, self.cfg.train.max_staleness,
                                          lambda: self.version, self.stats.count, self._sync_sampler)
        return SequentialSource(self.sample_and_share)

    def run(self, source: RolloutSource | None = None) -> RunSummary:
        if not self.ready:
            self.setup()
        cfg = self.cfg
        self.stats.update(total_steps=cfg.run.steps, policy_version=self.version, step=self.step)
        self.stats.set_phase("training")
        self.eval_before = self.evaluate() if cfg.run.eval_problems else None  # the held-out baseline
        self.source = source or self.default_source()
        try:
            self._loop(self.source)
        finally:
            self.source.close()
            self.source = None
        result = self.evaluate() if cfg.run.eval_problems else None
        self.stats.set_phase("done")
        return self.summary(result)

    def _loop(self, source: RolloutSource) -> None:
        cfg = self.cfg
        items = iter(source)
        with StepLog(self.run_dir / METRICS_FILE, self.stats, self.events) as log:
            while self.step < cfg.run.steps:
                try:
                    metrics = self.train_on(next(items))
                except KeyboardInterrupt:  # Ctrl-C: keep what the finished steps learnt, then stop
                    self.events.log(f"interrupted: saving a checkpoint at step {self.step}")
                    self.save_checkpoint()
                    raise
                source.trained(metrics)
                log.write(metrics)
                if self.step % cfg.run.checkpoint_every == 0 or self.step == cfg.run.steps:
                    self.save_checkpoint()
                if cfg.run.eval_every and self.step % cfg.run.eval_every == 0 and self.step < cfg.run.steps:
                    self.events.log(f"eval at step {self.step}: {self.evaluate()}")

    def generate_groups(self) -> tuple[list[ScoredGroup], float, int]:
        """Sample and score this step's local groups: (groups, seconds, generated tokens)."""
        cfg = self.cfg
        assert self.sampler is not None, "generate_groups() is called once setup() has built the sampler"
        count = self.hardware.sizes.prompts_per_step
        insts = [tasks.instance(r) for r in self.task_source.draw(self.rng, count, turn=self.draws * count)]
        prompts = [self.tokenizer.encode(i.prompt) for i in insts]
        params = SamplingParams(cfg.sampler.temperature, cfg.sampler.top_p, cfg.sampler.max_new_tokens,
                                seed=cfg.run.seed * 1_000_003 + self.draws)
        self.draws += 1
        started = time.monotonic()
        try:
            outputs = self.sampler.generate(prompts, cfg.run.group_size, params)
        except PromptTooLongError as exc:
            raise UserError(f"task {', '.join(self.task_source.names)}: {exc}") from exc
        seconds = time.monotonic() - started
        special = frozenset(self.tokenizer.all_special_ids)  # a completion must be the answer alone, then EOS
        groups = [score_group(i, p, out, self.task_source.reward, cfg.train.advantage,
                              eos_id=self.tokenizer.eos_token_id, special_ids=special)
                  for i, p, out in zip(insts, prompts, outputs, strict=True)]
        tokens = sum(len(c.token_ids) for out in outputs for c in out)
        return groups, seconds, tokens

    def _produce_overlapped(self) -> Item:
        """Generator thread: take the newest policy into the sampler, then draft one batch."""
        self._sync_sampler()
        return self.sample_and_share()

    def _sync_sampler(self) -> None:
        assert self.sampler is not None
        newer = self.latest_weights.newer_than(self.sampler.version)
        if newer is not None:
            self.sampler.load_weights(*newer)

    def sample_and_share(self) -> Item:
        """This step's local groups, sampled, scored and (peer) published; a `SkippedStep` if unusable."""
        assert self.sampler is not None, "sample_and_share() is called once setup() has built the sampler"
        step_started = time.monotonic()
        version = self.sampler.version
        try:
            groups, gen_s, gen_tokens = self.generate_groups()
        except FloatingPointError as exc:
            return SkippedStep(f"non-finite reward ({exc})")
        self.stats.count("groups", "produced", len(groups))
        if self.exchange is not None:
            peer = self.exchange.peer_id
            self.exchange.publish(self.wire_groups(groups, peer, version, peer, self.draws))
            # Our own groups replayed back by a peer are duplicates, not external groups (pool.mark_seen).
            self.pool.mark_seen(content_key(g.inst.ref, [c.token_ids for c in g.completions]) for g in groups)
        return Draft(groups, gen_s, gen_tokens, step_started, version)

    def _pool_sink(self, ext: External, sender: str) -> list[tuple[str, str]]:
        return self.pool.add(PoolEntry(ext.group, sender, ext.key, self.step, ext.retokenized))

    def mix_and_train(self, item: Item) -> dict[str, Any]:
        """The second half of a step outside `run()` (a lockstep simulation): train on it, record the step."""
        metrics = self.train_on(item)
        self.step_log.publish(metrics)
        return metrics

    def train_on(self, item: Item) -> dict[str, Any]:
        """One step on `item`: its metrics (not yet recorded; the loop or `mix_and_train` records them)."""
        return self._skip_step(item.reason) if isinstance(item, SkippedStep) else self._train(item)

    def _train(self, draft: Draft) -> dict[str, Any]:
        """Mix I local groups with J external ones from the pool and run one GRPO update."""
        cfg = self.cfg
        groups = draft.groups
        peer_mode = self.exchange is not None
        received = self.exchange.drain() if self.exchange is not None else []
        ext_dropped: dict[str, int] = {}
        if peer_mode:
            ext_dropped = self.ingest(received, time.time(), self._pool_sink)
            for sender, reason in self.pool.expire(self.step):
                self.ingest.drop(sender, reason, ext_dropped)
            self.stats.update(pool_size=len(self.pool))
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
        samples = to_samples(used) + external_samples(
            self.trainer, externals, cfg.share.correction.kind, CorrectionParams(**cfg.share.correction.knobs()))
        result = self.trainer.train_step(samples)
        train_s = time.monotonic() - train_started
        if result.skipped_minibatches:
            self.stats.count("errors", "nonfinite_loss", result.skipped_minibatches)
        if result.minibatches > result.skipped_minibatches:
            self.version += 1
            if self.source is None or self.source.direct_weights:
                assert self.sampler is not None
                self.sampler.load_weights(self.policy_weights(), self.version)
            else:  # the sampler is in use on the generator thread, or idle until an eval
                self.latest_weights.put(self.policy_weights(), self.version)
        self.step += 1
        metrics = {
            "step": self.step, "policy_version": self.version, "lag": max(lags, default=0),
            "reward_mean": sum(rewards) / len(rewards),
            "accuracy": sum(g.accuracy for g in groups) / len(groups),
            "per_task": per_task_metrics(groups),
            "groups_used": len(used), "groups_total": len(groups),
            "loss": result.loss, "clip_frac": result.clip_frac, "kl": result.kl, "entropy": result.entropy,
            "grad_norm": result.grad_norm, "skipped_minibatches": result.skipped_minibatches,
            "tokens_per_s": draft.gen_tokens / draft.gen_s if draft.gen_s > 0 else 0.0, "gen_tokens": draft.gen_tokens,
            "gen_s": draft.gen_s, "train_s": train_s, "step_s": self._step_seconds(draft),
            "time": time.time(),
        }
        metrics.update(self.hardware.after_step(self.step, self.trainer, self.sampler))  # the memory guard
        if peer_mode:
            ext_rewards = [r for e in externals for r in e.group.rewards]
            metrics.update({
                "external_used": len(externals),
                "external_sources": sorted({e.sender for e in externals}),
                "external_reward_mean": sum(ext_rewards) / len(ext_rewards) if ext_rewards else None,
                "pool_size": len(self.pool), "received": len(received), "external_dropped": ext_dropped,
            })
        return metrics

    def _step_seconds(self, draft: Draft) -> float:
        """Sequential: from the start of sampling. Overlapped: since the previous step ended (what a step costs)."""
        now = time.monotonic()
        overlapped = isinstance(self.source, OverlappedSource)
        since = draft.started if not overlapped or self._last_step_end is None else self._last_step_end
        self._last_step_end = now
        return now - since

    def _skip_step(self, reason: str) -> dict[str, Any]:
        self.skipped_steps += 1
        self.step += 1
        self.stats.count("errors", "skipped_step", 1)
        self.events.log(f"step {self.step} skipped: {reason}")
        return {"step": self.step, "policy_version": self.version, "skipped": reason, "time": time.time()}

    # -- checkpoints, eval, summary ------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        state = {"policy_version": self.version, "skipped_steps": self.skipped_steps,
                 "optimizer_steps": self.trainer.optimizer_steps,
                 "task_rng": checkpoint.state_to_json(self.rng.getstate()),
                 # The minibatch shuffle and the external selection too, so that a resumed run continues exactly.
                 "trainer_rng": checkpoint.state_to_json(self.trainer.rng.getstate()),
                 "share_rng": checkpoint.state_to_json(self.share_rng.getstate()), "config": self.cfg.to_dict()}
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
        with self.source.paused() if self.source is not None else contextlib.nullcontext():
            self._sync_sampler()
            assert self.sampler is not None
            result = evaluate(self.sampler, self.tokenizer, self.task_source, self.cfg.run.eval_problems,
                              self.cfg.sampler.max_new_tokens)
        self.stats.set_phase("training")
        return result

    def summary(self, result: EvalResult | None) -> RunSummary:
        first, last = reward_window(self.run_dir / METRICS_FILE)
        return RunSummary(self.step, first, last, result, self.run_dir, self.skipped_steps,
                          self.eval_before)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
