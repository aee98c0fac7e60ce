"""The node: model, task source, sampler, trainer and checkpoints, driven by one loop over a rollout source.

The loop (`run(source)`): `for item in source: train_on(item)` until `run.steps`, recording each step (StepLog),
checkpointing every `run.checkpoint_every` steps or `run.checkpoint_every_s` seconds, whichever comes first
(node/resume.CheckpointSchedule), evaluating every E. `item` is a `Draft` (groups to train on) or a `SkippedStep`
(counted as a step, nothing trained). `local_source(on_draft)` is the node's own generation: sampled on the
training thread (`SequentialSource`) or, with `train.max_staleness` >= 1, on a generator thread bounded by S
(`OverlappedSource`); `on_draft` sees each draft as it is made (a SAPO peer publishes it). A role passes its own
source (a SAPO peer's `SharingSource`, an ECHO-2 learner's buffer). See sources.py; `assembly.py` builds them.

One step: the draft's local groups (`draft()`: B task references, G completions each, scored by our verifier, group
advantages) without signal are dropped; the rest are mixed with the draft's external groups (`Draft.externals`, taken by
a SAPO peer from its pool just before the update, weighted by the configured correction), the GRPO update runs, and the
sampler gets the new weights (policy version + 1). The node knows nothing of sharing beyond that. `draft()` and
`train_on(item)` are the two halves with typed values, so a lockstep simulation runs the network between them.

After `setup()` the node is sealed: assigning a public attribute from outside raises `AttributeError` (what a node
is built from goes to its constructor; its run state lives in private attributes behind read-only properties).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from protocol.limits import Limits
from swarm_node import tasks
from swarm_node.config import NodeConfig
from swarm_node.errors import UserError
from swarm_node.model import lora
from swarm_node.model.default_model import load_model
from swarm_node.model.prompting import build_prompter
from swarm_node.model.tokenizer import eos_ids, tokenizer_hash
from swarm_node.node.build import model_dir_for, sampler_settings, seeded, with_model_defaults
from swarm_node.node.hardware import Hardware
from swarm_node.node.resume import CheckpointSchedule, RandomStreams, restore_latest, save
from swarm_node.node.run_files import METRICS_FILE, NodeEvents, RunSummary, StepLog, prepare_run_dir, reward_window
from swarm_node.node.sources import Item, OverlappedSource, RolloutSource, SequentialSource
from swarm_node.sampler.base import PromptTooLongError, Sampler, SamplingParams
from swarm_node.sampler.factory import make_sampler
from swarm_node.sharing.corrections import CorrectionParams, external_samples
from swarm_node.status.stats import NodeStats
from swarm_node.train.evaluate import EvalResult, evaluate, per_task_metrics
from swarm_node.train.overlap import LatestWeights
from swarm_node.train.partial import ROLLOUT_MODES, RolloutRequest, StepTurns
from swarm_node.train.scoring import GroupScorer, to_samples
from swarm_node.train.signal import AFTER_STEPS as SIGNAL_AFTER_STEPS
from swarm_node.train.signal import SignalWatch
from swarm_node.train.step_metrics import completion_lengths, completion_metrics
from swarm_node.train.trainer import Trainer
from swarm_node.types import Draft, ScoredGroup, SkippedStep

__all__ = ["METRICS_FILE", "Draft", "Node", "NodeEvents", "RunSummary", "SkippedStep", "prepare_run_dir"]


class Node:
    def __init__(self, cfg: NodeConfig, stats: NodeStats | None = None, events: NodeEvents | None = None,
                 model_dir: Path | None = None, sampler: Sampler | None = None, salt: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = seeded(cfg)  # no run seed given: 0 (a joined node's is derived from its identity first)
        self.stats = stats or NodeStats()
        self.events = events or NodeEvents()
        self.run_dir = Path(cfg.run.run_dir)
        self._model_dir_override = model_dir  # a simulation may hand nodes different starting weights
        self._salt = salt  # draw other tasks and samples than a node with the same seed (ECHO-2 workers)
        self._sampler: Sampler | None = sampler  # given: a simulation's shared engine; else built by setup()
        self._step = 0
        self._version = 0
        self._skipped_steps = 0
        self._draws = 0  # batches drawn so far: seeds the sampler (ahead of `step` when generation overlaps)
        self._source: RolloutSource | None = None  # while run() runs
        self._latest_weights = LatestWeights()
        self._step_log = StepLog(None, self.stats, self.events)  # records steps trained outside run() (simulations)
        self._last_step_end: float | None = None
        self._clock = clock  # what the time-based checkpoint schedule reads
        self._rollouts = ROLLOUT_MODES[self.cfg.run.rollout.kind](self.cfg.run.rollout)  # carries APRIL's partials
        self._rollout_counts: tuple[tuple[str, int], ...] = ()  # the last generation's (train/partial.Rollouts)
        self._sealed = False

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and self.__dict__.get("_sealed"):
            raise AttributeError(f"Node.{name} cannot be assigned once the node is set up: pass what a node is "
                                 "built from to its constructor or to the assembly (swarm_node/node/assembly.py)")
        super().__setattr__(name, value)

    # -- read-only run state ---------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    @property
    def version(self) -> int:
        return self._version

    @property
    def sampler(self) -> Sampler | None:
        return self._sampler

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        prepare_run_dir(self.run_dir)
        torch.set_num_threads(cfg.train.threads or os.cpu_count() or 1)
        self.task_source = cfg.task.build_source(eval_problems=cfg.run.eval_problems)  # too small: fails now
        self._allocation = tasks.ROLLOUT_ALLOCATIONS[cfg.run.rollout_allocation]
        # Pass rates are kept only where something reads them: the adaptive selection, an allocation that needs them.
        self._track_rates = self.task_source.reads_rates or self._allocation.reads_rates
        self.stats.set_phase("building-model")
        self.model_dir = model_dir_for(cfg, self._model_dir_override, self.events.build_progress)
        self.cfg = cfg = with_model_defaults(cfg, self.model_dir)  # sampling settings left unset: the model's own
        # Device, precision and memory sizing (node/hardware.py), before any weights load.
        self.hardware = Hardware.prepare(cfg, self.model_dir, self.task_source, self.events.log, run_dir=self.run_dir)
        self.model, self.tokenizer = load_model(self.model_dir)
        if cfg.train.lora_rank:
            lora.attach_lora(self.model, cfg.train.lora_rank, cfg.train.lora_alpha, seed=cfg.run.seed)
        self.hardware.place(self.model)
        self.trainer = Trainer(self.model, cfg.train, cfg.sampler, self.tokenizer.pad_token_id, cfg.run.seed,
                               autocast=self.hardware.autocast, vocab=len(self.tokenizer))
        # The node's random streams: task draws, the minibatch shuffle, and a SAPO peer's external selection.
        self.streams = RandomStreams(random.Random(cfg.run.seed), self.trainer.rng,
                                     random.Random(cfg.run.seed * 7919 + 17), self.task_source.book)
        # Every id that ends a completion: the tokenizer's EOS and those of the model's generation config.
        self.eos_ids = eos_ids(self.tokenizer, getattr(self.model.generation_config, "eos_token_id", None))
        # How prompts ask and answers are read (the model's own format unless --prompt-format), and the reward terms.
        self.prompter = build_prompter(cfg.task.prompt_format, self.tokenizer, cfg.sampler.max_new_tokens)
        self.reward_terms = cfg.task.reward_terms(cfg.sampler.max_new_tokens)
        self._score = GroupScorer(self.task_source.reward, cfg.train.advantage, self.eos_ids,
                                  frozenset(self.tokenizer.all_special_ids), self.prompter.fmt, self.reward_terms)
        self._signal = SignalWatch(SIGNAL_AFTER_STEPS, cfg.sampler.max_new_tokens, self.eos_ids,
                                   self.tokenizer.all_special_ids, self.prompter.fmt)
        self.tokenizer_hash = tokenizer_hash(self.tokenizer)
        self.family = str(getattr(self.model.config, "model_type", ""))  # what our published groups say
        self._restore_or_start()
        if self._salt is not None:
            self.streams.task.seed(cfg.run.seed * 2**32 + self._salt)
            self._draws = self._salt << 16
        self.stats.set_phase("loading-sampler")
        if self._sampler is None:
            settings = sampler_settings(cfg.sampler, self.hardware.sizes, self.hardware.sampler_dtype)
            self._sampler = make_sampler(cfg.sampler.kind, self.model_dir, self.model, self.tokenizer, settings,
                                         self._version, self.events.log)
        if self._step > 0:
            self._sampler.load_weights(self.policy_weights(), self._version)
        self.hardware.attach(self.trainer, self._sampler)
        self._sealed = True

    def wire_limits(self) -> Limits:
        """The wire limits of every exchange a role runs for this node: the token ids of a group of our tokenizer
        bounded by our vocabulary (another tokenizer's are re-tokenised from the text)."""
        return Limits(vocab_size=len(self.tokenizer), tokenizer_hash=self.tokenizer_hash)

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The current policy in the form this node's sampler loads (see `Sampler.weights`)."""
        assert self._sampler is not None, "policy_weights() is called once setup() has built the sampler"
        form = self._sampler.weights if self.cfg.train.lora_rank else "full"
        return lora.WEIGHT_FORMS[form](self.model)

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Install a policy someone else trained (an ECHO-2 worker's followed policy) into the sampler."""
        assert self._sampler is not None, "load_policy() is called once setup() has built the sampler"
        self._sampler.load_weights(state, version)

    def _restore_or_start(self) -> None:
        restored = restore_latest(self.run_dir, self.cfg.run.resume, self.model, self.trainer, self.streams,
                                  self.events.log)
        if restored is not None:
            self._step = self._draws = restored.step
            self._version, self._skipped_steps = restored.version, restored.skipped_steps
            self.stats.update(last_checkpoint={"step": restored.step, "path": str(restored.path)})

    # -- the loop ------------------------------------------------------------------------------------
    def local_source(self, on_draft: Callable[[Item], Item] | None = None) -> RolloutSource:
        """The node's own generation as a rollout source: sequential, or overlapped with training when
        `train.max_staleness` >= 1 (the generator thread starts on the first draft asked for). `on_draft` sees each
        draft where it is made (a SAPO peer publishes it there)."""
        def draft() -> Item:
            item = self.draft()
            return on_draft(item) if on_draft is not None else item

        if self.cfg.train.max_staleness > 0:
            def produce() -> Item:  # generator thread: take the newest policy into the sampler, then draft
                self._sync_sampler()
                return draft()

            return OverlappedSource.deferred(produce, self.cfg.train.max_staleness, lambda: self._version,
                                             self.stats.count, self._sync_sampler)
        return SequentialSource(draft)

    def run(self, source: RolloutSource | None = None) -> RunSummary:
        """Train until `run.steps` on `source` (default: the node's own generation, `local_source()`)."""
        if not self._sealed:
            self.setup()
        cfg = self.cfg
        self.stats.update(total_steps=cfg.run.steps, policy_version=self._version, step=self._step)
        self.stats.set_phase("training")
        self._source = source or self.local_source()
        try:
            eval_before = self.evaluate() if cfg.run.eval_problems else None  # the held-out baseline
            self._loop(self._source)
        finally:
            self._source.close()
            self._source = None
        result = self.evaluate() if cfg.run.eval_problems else None
        self.stats.set_phase("done")
        first, last = reward_window(self.run_dir / METRICS_FILE)
        return RunSummary(self._step, first, last, result, self.run_dir, self._skipped_steps, eval_before)

    def _loop(self, source: RolloutSource) -> None:
        cfg = self.cfg
        items = iter(source)
        schedule = CheckpointSchedule(cfg.run.checkpoint_every, cfg.run.checkpoint_every_s, self._clock())
        with StepLog(self.run_dir / METRICS_FILE, self.stats, self.events) as log:
            while self._step < cfg.run.steps:
                try:
                    metrics = self.train_on(next(items))
                except KeyboardInterrupt:  # Ctrl-C: keep what the finished steps learnt, then stop
                    self.events.log(f"interrupted: saving a checkpoint at step {self._step}")
                    self.save_checkpoint()
                    raise
                source.trained(metrics)
                log.write(metrics)
                if schedule.due(self._step, cfg.run.steps, self._clock()):
                    self.save_checkpoint()
                    schedule.saved(self._clock())
                if cfg.run.eval_every and self._step % cfg.run.eval_every == 0 and self._step < cfg.run.steps:
                    self.events.log(f"eval at step {self._step}: {self.evaluate()}")

    def generate_groups(self) -> tuple[list[ScoredGroup], float, int]:
        """Sample and score this step's local groups: (groups, seconds, generated tokens), as the rollout mode
        (`[run.rollout] kind`, train/partial.py) makes them; its counters go to `self.rollout_counts`."""
        cfg = self.cfg
        assert self._sampler is not None, "generate_groups() is called once setup() has built the sampler"
        count = self.hardware.sizes.prompts_per_step
        source = self.task_source
        turns = StepTurns(self._draws * count, self._draws)  # a refill (dynamic sampling) goes on rotating

        def draw(n: int) -> list[tuple[tasks.TaskInstance, list[int]]]:
            insts = [tasks.instance(r) for r in source.draw(self.streams.task, n, turn=turns.next(n))]
            return [(i, self.prompter.ids(i)) for i in insts]

        params = SamplingParams(*cfg.sampler.temperature_top_p(), cfg.sampler.max_new_tokens,
                                seed=cfg.run.seed * 1_000_003 + self._draws)
        self._draws += 1
        # Completions per prompt: G each, or (run.rollout_allocation = dars) more for hard unsolved ones, same total.
        def sizes(insts: list[tasks.TaskInstance]) -> list[int]:
            return self._allocation.allocate([source.rate(i.ref) for i in insts], cfg.run.group_size)

        started = time.monotonic()
        try:
            rollouts = self._rollouts.step(RolloutRequest(self._sampler, draw, count, cfg.run.group_size, params,
                                                          frozenset(self.eos_ids), sizes, self._score.has_signal))
        except PromptTooLongError as exc:
            raise UserError(f"task {', '.join(source.names)}: {exc} (lower sampler.max_new_tokens, or on vLLM raise "
                            "sampler.max_model_len up to the model's context; docs/SIZING.md)") from exc
        seconds = time.monotonic() - started
        self._rollout_counts = rollouts.counts
        for reason, n in rollouts.counts:
            if reason in ("stale", "resume_failed") and n:
                self.stats.count("dropped", f"partial_{reason}", n)
        groups = [self._score(g) for g in rollouts.groups]  # a completion must be in the format, then EOS
        if self._track_rates:  # the adaptive selection's and the allocation's estimates (checkpointed)
            for group in groups:
                source.book.record(group.inst.ref, group.correctness())
        return groups, seconds, rollouts.gen_tokens

    def _sync_sampler(self) -> None:
        assert self._sampler is not None
        newer = self._latest_weights.newer_than(self._sampler.version)
        if newer is not None:
            self._sampler.load_weights(*newer)

    def draft(self) -> Item:
        """This step's local groups, sampled and scored; a `SkippedStep` if unusable."""
        assert self._sampler is not None, "draft() is called once setup() has built the sampler"
        step_started = time.monotonic()
        version = self._sampler.version
        try:
            groups, gen_s, gen_tokens = self.generate_groups()
        except FloatingPointError as exc:
            return SkippedStep(f"non-finite reward ({exc})")
        self.stats.count("groups", "produced", len(groups))
        return Draft(groups, gen_s, gen_tokens, step_started, version, draw=self._draws,
                     rollout=self._rollout_counts)

    def mix_and_train(self, item: Item) -> dict[str, Any]:
        """The second half of a step outside `run()` (a lockstep simulation): train on it, record the step."""
        metrics = self.train_on(item)
        self._step_log.publish(metrics)
        return metrics

    def train_on(self, item: Item) -> dict[str, Any]:
        """One step on `item`: its metrics (not yet recorded; the loop or `mix_and_train` records them)."""
        return self._skip_step(item.reason) if isinstance(item, SkippedStep) else self._train(item)

    def _train(self, draft: Draft) -> dict[str, Any]:
        """Mix the draft's local groups that have signal with its external ones and run one GRPO update."""
        cfg = self.cfg
        groups, externals = draft.groups, draft.externals
        rewards = [r for g in groups for r in g.rewards]
        used = [g for g in groups if g.has_signal]
        self._say_if_nothing_is_learnt(groups)
        self.stats.count("dropped", "zero_advantage", len(groups) - len(used))
        self.stats.count("groups", "used", len(used) + len(externals))
        # Version lag of each group (0 in the sequential loop, <= max_staleness when generation overlaps or the
        # groups come from workers): lag > 0 trains with the truncated importance weight.
        # A completion resumed under newer policies (APRIL) is as old as its oldest span.
        lags = [self._version - g.oldest_version for g in groups]
        for g, lag in zip(groups, lags, strict=True):
            if g.has_signal:
                self.stats.count("staleness", lag, len(g.completions))
        # Other processes' log-probs (a learner's workers) are never the ratio's reference: untrusted, and from the
        # published policy, not ours; they only enter the truncated weight min(pi/mu, is_cap).
        off_policy = [self._version - g.oldest_version > 0 or not g.origin.is_local for g in used]
        train_started = time.monotonic()
        samples = to_samples(used, off_policy, self._version) + external_samples(
            self.trainer, list(externals), cfg.share.correction.kind, CorrectionParams(**cfg.share.correction.knobs()))
        result = self.trainer.train_step(samples)
        train_s = time.monotonic() - train_started
        if result.skipped_minibatches:  # said, not only counted: a run that skips them all trains nothing
            self.stats.count("errors", "nonfinite_loss", result.skipped_minibatches)
            self.events.log(f"step {self._step + 1}: {result.skipped_minibatches} of {result.minibatches} minibatches "
                            "skipped (non-finite loss or gradient): they did not train")
        if result.minibatches > result.skipped_minibatches:
            self._version += 1
            if self._source is None or self._source.direct_weights:
                assert self._sampler is not None
                self._sampler.load_weights(self.policy_weights(), self._version)
            else:  # the sampler is in use on the generator thread, or idle until an eval
                self._latest_weights.put(self.policy_weights(), self._version)
        self._step += 1
        metrics = {
            "step": self._step, "policy_version": self._version, "lag": max(lags, default=0),
            "reward_mean": sum(rewards) / len(rewards), "accuracy": sum(g.accuracy for g in groups) / len(groups),
            "per_task": per_task_metrics(list(groups)), "groups_used": len(used), "groups_total": len(groups),
            "loss": result.loss, "clip_frac": result.clip_frac, "kl": result.kl, "entropy": result.entropy,
            "grad_norm": result.grad_norm, "skipped_minibatches": result.skipped_minibatches,
            "tokens_per_s": draft.gen_tokens / draft.gen_s if draft.gen_s > 0 else 0.0, "gen_tokens": draft.gen_tokens,
            "gen_s": draft.gen_s, "train_s": train_s, "step_s": self._step_seconds(draft), "time": time.time(),
        }
        # the stale correction's statistics (train.stale_correction: m2po's masked_frac, vcpo's ess)
        metrics.update({f"stale_{name}": value for name, value in result.correction.items()})
        metrics.update(completion_metrics(completion_lengths(groups), draft.gen_s, metrics["step_s"]))
        metrics.update(self.hardware.after_step(self._step, self.trainer, self._sampler))  # the memory guard
        metrics.update({f"rollout_{name}": value for name, value in draft.rollout})  # APRIL's counters
        if draft.share is not None:
            metrics.update(draft.share.metrics(externals))
        return metrics

    def _say_if_nothing_is_learnt(self, groups: tuple[ScoredGroup, ...]) -> None:
        """Once per streak of steps without a group with signal: the likely cause and its fix (train/signal.py)."""
        report = self._signal.observe(groups)
        budget = self.cfg.sampler.max_new_tokens
        if report is not None:
            self.events.log(f"warning: {report.line(budget)}")
            self.stats.update(training_signal=report.status(budget))
        elif self._signal.streak == 0 and self.stats.training_signal is not None:
            self.stats.update(training_signal=None)

    def _step_seconds(self, draft: Draft) -> float:
        """Sequential: from the start of sampling. Overlapped: since the previous step ended (what a step costs)."""
        now = time.monotonic()
        overlapped = self._source is not None and self._source.overlapped
        since = draft.started if not overlapped or self._last_step_end is None else self._last_step_end
        self._last_step_end = now
        return now - since

    def _skip_step(self, reason: str) -> dict[str, Any]:
        self._skipped_steps += 1
        self._step += 1
        self.stats.count("errors", "skipped_step", 1)
        self.events.log(f"step {self._step} skipped: {reason}")
        return {"step": self._step, "policy_version": self._version, "skipped": reason, "time": time.time()}

    # -- checkpoints, eval ---------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        save(self.run_dir, self._step, self.model, self.trainer, self.streams, self.cfg, self.stats, self.events.log,
             version=self._version, skipped_steps=self._skipped_steps)

    def evaluate(self, split: str = tasks.DEFAULT_SPLIT) -> EvalResult:
        """Held-out eval of the newest policy on `split` (with the generator paused when generation overlaps)."""
        self.stats.set_phase("evaluating")
        with self._source.paused() if self._source is not None else contextlib.nullcontext():
            self._sync_sampler()
            assert self._sampler is not None
            result = evaluate(self._sampler, self.tokenizer, self.task_source, self.cfg.run.eval_problems,
                              self.cfg.sampler.max_new_tokens, eos_ids=self.eos_ids, prompter=self.prompter,
                              split=split)
        self.stats.set_phase("training")
        return result

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
