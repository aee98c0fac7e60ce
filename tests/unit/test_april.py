"""APRIL's partial rollouts: per-span versions, the per-span staleness bound, per-token stale flags in the trainer's
rows, resuming in the transformers and native samplers, the failed-resume discard, and an over-provisioned step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from swarm_node.config import AprilRolloutConfig, SamplerConfig, TrainConfig, load_config
from swarm_node.errors import ConfigError
from swarm_node.model.default_model import load_model
from swarm_node.node.core import Node, NodeEvents
from swarm_node.sampler.base import ResumeError, Sampler, SamplingParams, extend_completion
from swarm_node.sampler.hf import HFSampler
from swarm_node.sampler.native import NativeSampler
from swarm_node.tasks import TaskInstance
from swarm_node.train.batching import collate
from swarm_node.train.partial import ROLLOUT_MODES, AprilRollouts, PendingGroup, RolloutRequest, expire
from swarm_node.train.scoring import to_samples
from swarm_node.train.staleness import span_drop_reason
from swarm_node.train.trainer import Trainer
from swarm_node.types import Completion, ScoredGroup, TrainSample

EOS = 0


def test_a_completion_resumed_at_a_newer_version_carries_both_spans() -> None:
    partial = Completion((5, 6, 7), "abc", (-0.1, -0.2, -0.3), version=4)
    assert partial.version_spans() == ((0, 4),) and partial.oldest_version == 4
    resumed = extend_completion(partial, [8, 9], [-0.4, -0.5], version=5, text="abcde")
    assert resumed.spans == ((0, 4), (3, 5))
    assert resumed.version == 5 and resumed.oldest_version == 4
    assert resumed.token_ids == (5, 6, 7, 8, 9) and resumed.logprobs == (-0.1, -0.2, -0.3, -0.4, -0.5)
    assert resumed.token_versions() == (4, 4, 4, 5, 5)
    again = extend_completion(resumed, [10], [-0.6], version=5, text="abcdef")  # the same policy: the same span
    assert again.spans == ((0, 4), (3, 5)) and again.token_versions() == (4, 4, 4, 5, 5, 5)
    same = extend_completion(partial, [8], [-0.4], version=4, text="abcd")
    assert same.spans == () and same.version_spans() == ((0, 4),)
    third = extend_completion(resumed, [10], [-0.6], version=7, text="abcdef")
    assert third.spans == ((0, 4), (3, 5), (5, 7)) and third.token_versions() == (4, 4, 4, 5, 5, 7)


def test_a_completion_from_received_spans_is_versioned_by_its_newest_span() -> None:
    two = Completion.from_spans([5, 6, 7], "abc", [-0.1, -0.2, -0.3], [(0, 2), (1, 3)], version=9)
    assert two.version == 3 and two.spans == ((0, 2), (1, 3)) and two.oldest_version == 2
    one = Completion.from_spans([5, 6], "ab", [-0.1, -0.2], [(0, 2)], version=9)  # one span: the version alone
    assert one == Completion((5, 6), "ab", (-0.1, -0.2), 2)
    none = Completion.from_spans([5], "a", [-0.1], (), version=9)  # no spans: the version given
    assert none == Completion((5,), "a", (-0.1,), 9)


def test_the_staleness_bound_reads_the_oldest_span() -> None:
    assert span_drop_reason(6, [3, 5], 2) == "stale"
    assert span_drop_reason(6, [4, 6], 2) is None
    assert span_drop_reason(6, [5, 7], 2) == "future_version"
    inst = TaskInstance.__new__(TaskInstance)
    fresh = Completion((1, 2), "", (-0.1, -0.1), 5)
    old = Completion((1, 2, 3), "", (-0.1,) * 3, 6, spans=((0, 3), (2, 6)))
    kept, dropped = expire([PendingGroup(inst, (9,), (fresh, fresh), 1), PendingGroup(inst, (8,), (fresh, old), 1)],
                           current_version=6, max_lag=2)
    assert [g.prompt_ids for g in kept] == [(9,)] and dropped == 2
    kept, dropped = expire([PendingGroup(inst, (8,), (fresh, old), 1)], current_version=6, max_lag=3)
    assert len(kept) == 1 and dropped == 0


def _group(*completions: Completion) -> ScoredGroup:
    inst = TaskInstance.__new__(TaskInstance)
    n = len(completions)
    return ScoredGroup(inst, (3, 4), completions, (1.0,) * n, tuple(1.0 - 2.0 * (i % 2) for i in range(n)))


def test_trainer_rows_mark_the_tokens_an_older_policy_sampled() -> None:
    resumed = Completion((5, 6, 7, 8), "", (-1.0,) * 4, 3, spans=((0, 2), (2, 3)))
    plain = Completion((5, 6), "", (-1.0,) * 2, 3)
    group = _group(resumed, plain)
    rows = to_samples([group], [True], current_version=3)
    assert rows[0].off_policy and rows[0].stale_tokens == (True, True, False, False)
    assert rows[1].off_policy and rows[1].stale_tokens is None  # its group is off-policy; no span of its own
    fresh_group = _group(plain, plain)
    assert [(r.off_policy, r.stale_tokens) for r in to_samples([fresh_group], [False], 3)] == [(False, None)] * 2
    # a group the node counts as on-policy still marks its resumed completion's old tokens
    rows = to_samples([_group(resumed, plain)], [False], current_version=3)
    assert (rows[0].off_policy, rows[0].stale_tokens) == (True, (True, True, False, False))
    assert (rows[1].off_policy, rows[1].stale_tokens) == (False, None)
    # every token older: the row is stale whole, as before
    rows = to_samples([_group(resumed, plain)], [True], current_version=4)
    assert (rows[0].off_policy, rows[0].stale_tokens) == (True, None)
    batch = collate(to_samples([group], [True], current_version=3), pad_id=0)
    assert batch.stale_tokens is not None
    assert batch.stale_tokens.tolist() == [[True, True, True, False, False], [True, True, True, True, True]]


def test_the_stale_correction_applies_to_the_stale_tokens_alone(tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(minibatches=1), SamplerConfig(), tok.pad_token_id)
    prompt, completion = tuple(tok.encode("1 + 2 =")), tuple(tok.encode("3 ok"))
    batch = collate([TrainSample(prompt, completion, (0.0,) * len(completion), 1.0)], tok.pad_token_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(model, batch)
    # behaviour log-probs off the current policy by varying amounts, so the truncated weight matters
    current = logp[batch.mask.bool()].tolist()
    behaviour = tuple(lp - 0.5 - 0.3 * k for k, lp in enumerate(current))  # ratios 1.65 to 4: clip and cap differ
    n, k = len(completion), 2
    stale = tuple(i < k for i in range(n))

    def loss(sample: TrainSample) -> float:
        result = trainer.accumulate([collate([sample], tok.pad_token_id)])
        assert result is not None
        return result["loss"]

    mixed = loss(TrainSample(prompt, completion, behaviour, 1.0, True, stale_tokens=stale))
    # the same row split by token: its fresh tokens as an on-policy row, its stale ones as a stale row
    fresh_part = loss(TrainSample(prompt, completion, behaviour, 1.0, False,
                                  token_weights=tuple(0.0 if s else 1.0 for s in stale)))
    stale_part = loss(TrainSample(prompt, completion, behaviour, 1.0, True,
                                  token_weights=tuple(1.0 if s else 0.0 for s in stale)))
    assert mixed == pytest.approx(fresh_part + stale_part, rel=1e-6, abs=1e-7)
    whole_stale = loss(TrainSample(prompt, completion, behaviour, 1.0, True))
    on_policy = loss(TrainSample(prompt, completion, behaviour, 1.0, False))
    assert mixed != pytest.approx(whole_stale) and mixed != pytest.approx(on_policy)
    # flags all False on an off-policy row: exactly the on-policy row; all True: exactly the stale row
    assert loss(TrainSample(prompt, completion, behaviour, 1.0, True, stale_tokens=(False,) * n)) == on_policy
    assert loss(TrainSample(prompt, completion, behaviour, 1.0, True, stale_tokens=(True,) * n)) == whole_stale


@pytest.mark.parametrize("kind", [HFSampler, NativeSampler])
def test_a_sampler_resumes_token_identically_to_an_uninterrupted_greedy_generation(tiny_model_dir: Path,
                                                                                   kind: type[HFSampler]) -> None:
    model, tok = load_model(tiny_model_dir)
    sampler = kind(model, tok, version=3)
    prompts = [tok.encode("12 + 7 =\nAnswer: "), tok.encode("4 * 5 =")]  # different lengths: left padding
    whole = [g[0] for g in sampler.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=24))]
    assert all(len(c.token_ids) == 24 for c in whole)  # the random tiny model does not stop early
    chunk = SamplingParams(temperature=0.0, max_new_tokens=8)
    parts = [g[0] for g in sampler.generate(prompts, 1, chunk)]
    parts = sampler.resume(prompts, parts, chunk)
    sampler.load_weights(model.state_dict(), version=4)  # a new version, the same weights
    parts = sampler.resume(prompts, parts, chunk)
    for part, ref in zip(parts, whole, strict=True):
        assert part.token_ids == ref.token_ids
        assert part.text == ref.text
        assert part.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
        assert part.spans == ((0, 3), (16, 4)) and part.version == 4


@pytest.mark.parametrize("kind", [HFSampler, NativeSampler])
def test_a_partial_completion_the_weights_cannot_hold_fails_to_resume(tiny_model_dir: Path,
                                                                      kind: type[HFSampler]) -> None:
    model, tok = load_model(tiny_model_dir)
    sampler = kind(model, tok)
    alien = Completion((int(model.config.vocab_size) + 5,), "", (-1.0,), 0)
    with pytest.raises(ResumeError):
        sampler.resume([tok.encode("1 + 1 =")], [alien], SamplingParams(max_new_tokens=4))


class LengthSampler(Sampler):
    """A prompt [L, marker] gets completions of exactly L tokens: 1s, then EOS; deterministic, any version."""

    def __init__(self, fail_resume: bool = False) -> None:
        self.version = 0
        self.fail_resume = fail_resume
        self.calls: list[tuple[int, int]] = []  # (rows, max_new_tokens) per generate call
        self.engine = 1

    @property
    def engine_id(self) -> int:
        return self.engine

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        self.calls.append((len(prompts) * n, params.max_new_tokens))
        out = []
        for row in prompts:
            length, done = row[0], len(row) - 2
            new = min(params.max_new_tokens, length - done)
            ids = [1] * new
            if done + new == length:
                ids[-1] = EOS
            out.append([Completion(ids, "", [-0.5] * new, self.version) for _ in range(n)])
        return out

    def resume(self, prompts: list[list[int]], partials: list[Completion],
               params: SamplingParams) -> list[Completion]:
        if self.fail_resume:
            raise ResumeError("engine restarted")
        return super().resume(prompts, partials, params)

    def decode(self, token_ids: tuple[int, ...] | list[int]) -> str:
        return "x" * len(token_ids)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.version = version


def _request(sampler: Sampler, lengths: list[int], target: int, drawn: list[int]) -> RolloutRequest:
    inst = TaskInstance.__new__(TaskInstance)

    def draw(count: int) -> list[tuple[TaskInstance, list[int]]]:
        drawn.append(count)
        taken, lengths[:] = lengths[:count], lengths[count:]
        return [(inst, [length, 100]) for length in taken]

    return RolloutRequest(sampler, draw, target, 2, SamplingParams(max_new_tokens=64, seed=5), frozenset({EOS}))


def test_an_over_provisioned_step_returns_the_target_groups_and_carries_the_rest() -> None:
    sampler = LengthSampler()
    april = ROLLOUT_MODES["april"](AprilRolloutConfig(over=0.5, chunk_tokens=4, max_lag=2))
    assert isinstance(april, AprilRollouts)
    lengths, drawn = [4, 40, 6, 5, 3], []
    first = april.step(_request(sampler, lengths, 2, drawn))
    assert drawn == [3]  # 2 x 1.5 prompts in flight
    assert [g.prompt_ids[0] for g in first.groups] == [4, 6]  # complete after rounds 0 and 1
    assert all(len(c.token_ids) == g.prompt_ids[0] and c.token_ids[-1] == EOS
               for g in first.groups for c in g.completions)
    assert [(g.prompt_ids[0], [len(c.token_ids) for c in g.completions]) for g in april.carried] == [(40, [8, 8])]
    assert first.gen_tokens == 2 * (4 + 4 + 4) + 2 * (0 + 4 + 2)  # round 0: 4 each; round 1: 4 (the 40), 2 (the 6)
    assert first.reprefilled_tokens == 2 * 4 + 2 * 4  # round 1 re-prefilled the 40's and the 6's 4 tokens
    counts = dict(first.counts)
    assert counts["carried_out"] == 1 and counts["rounds"] == 2 and counts["stale"] == 0
    sampler.load_weights({}, version=1)
    second = april.step(_request(sampler, lengths, 2, drawn))
    assert drawn == [3, 2]  # the carried group counts against the three in flight
    assert sorted(g.prompt_ids[0] for g in second.groups) == [3, 5]
    carried = april.carried[0]
    assert carried.prompt_ids[0] == 40 and carried.completions[0].spans == ((0, 0), (8, 1))
    assert dict(second.counts)["carried_in"] == 1


def test_a_partial_completion_that_fails_to_resume_is_discarded_and_counted() -> None:
    sampler = LengthSampler()
    april = AprilRollouts(over=0.5, chunk_tokens=4, max_lag=2)
    lengths, drawn = [4, 40, 6, 4, 4, 4, 4], []
    april.step(_request(sampler, lengths, 2, drawn))
    assert len(april.carried) == 1
    sampler.engine = 2  # the engine restarted: what it had started is gone
    second = april.step(_request(sampler, lengths, 2, drawn))
    assert dict(second.counts)["resume_failed"] == 2 and all(g.prompt_ids[0] != 40 for g in second.groups)
    # a sampler that raises ResumeError: the groups it could not continue are dropped, never returned
    failing = LengthSampler(fail_resume=True)
    april = AprilRollouts(over=0.5, chunk_tokens=4, max_lag=2)
    third = april.step(_request(failing, [4, 40, 6], 2, []))
    assert [g.prompt_ids[0] for g in third.groups] == [4]
    assert dict(third.counts)["resume_failed"] == 4 and april.carried == []


def test_a_carried_group_past_the_lag_bound_is_discarded() -> None:
    sampler = LengthSampler()
    april = AprilRollouts(over=0.5, chunk_tokens=4, max_lag=1)
    lengths, drawn = [4, 40, 6] + [4] * 10, []
    april.step(_request(sampler, lengths, 2, drawn))
    sampler.load_weights({}, version=2)
    step = april.step(_request(sampler, lengths, 2, drawn))
    assert dict(step.counts)["stale"] == 2 and all(g.prompt_ids[0] != 40 for g in step.groups)


def test_the_rollout_config_is_a_variant_section() -> None:
    cfg = load_config(None, {"run.rollout.kind": "april", "run.rollout.over": 1.0})
    assert isinstance(cfg.run.rollout, AprilRolloutConfig) and cfg.run.rollout.over == 1.0
    assert load_config(None, {}).run.rollout.kind == "sync"
    with pytest.raises(ConfigError):
        load_config(None, {"run.rollout.over": 1.0})
    with pytest.raises(ConfigError):
        load_config(None, {"run.rollout.kind": "april", "run.rollout.chunk_tokens": 0})


def test_a_node_in_april_mode_trains_on_the_target_groups(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 2,
                             "run.prompts_per_step": 2, "run.group_size": 2, "run.eval_problems": 0,
                             "run.checkpoint_every": 100, "run.run_dir": str(tmp_path / "run"), "train.threads": 1,
                             "status.port": -1, "task.reward": "score", "sampler.max_new_tokens": 8,
                             "run.rollout.kind": "april", "run.rollout.chunk_tokens": 4})
    node = Node(cfg, events=NodeEvents(log=lambda _m: None))
    node.setup()
    try:
        node.run()
    finally:
        node.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["groups_total"] for r in rows] == [2, 2]
    assert all("rollout_carried_out" in r and "rollout_reprefilled_tokens" in r for r in rows)
