"""Task mixes: config syntax and its one-line errors, the weighted and balanced selections, what a node accepts
from peers (the wire policy and re-scoring), and per-specialty numbers in metrics and the status snapshot."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from protocol.errors import WireError
from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from protocol.validation import check_task_ref
from swarm_node import tasks
from swarm_node.config import load_config
from swarm_node.errors import ConfigError, UserError
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.exchange import accept_policy_for
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external
from swarm_node.status.stats import NodeStats
from swarm_node.train.evaluate import per_task_metrics
from swarm_node.types import Completion, ScoredGroup

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
MIX = [{"name": "chain_sum", "weight": 3.0}, {"name": "basic_arithmetic", "options": SMALL, "weight": 1.0}]
THREE = [{"name": "chain_sum"}, {"name": "basic_arithmetic", "options": SMALL}, {"name": "leg_counting"}]


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_mix_and_accept_from_toml(tmp_path: Path) -> None:
    cfg = load_config(toml(tmp_path, """[task]
selection = "balanced"
mix = [{name = "chain_sum", weight = 2}, {name = "basic_arithmetic", options = {min_terms = 2, max_terms = 2}}]
accept = [{name = "chain_sum"}, {name = "leg_counting", options = {}}]
"""))
    assert cfg.task.selection == "balanced" and [e["name"] for e in cfg.task.mix] == ["chain_sum", "basic_arithmetic"]
    source = tasks.TaskSource(seed=cfg.task.seed, selection=cfg.task.selection, mix=cfg.task.mix,
                              accept=cfg.task.accept)
    assert source.names == ("chain_sum", "basic_arithmetic") and source.weights == (2.0, 1.0)
    default_config = tasks.canonical_config(tasks.DEFAULT_TASK_OPTIONS)
    assert source.accepted == {("chain_sum", default_config), ("leg_counting", "{}")}
    assert (source.name, source.config) == ("chain_sum", default_config)  # a single task's view: the first


def test_the_default_task_is_the_embedded_mix_and_a_name_replaces_it(tmp_path: Path) -> None:
    default = load_config(None).task
    source = default.build_source()
    assert source.names == ("chain_sum", "basic_arithmetic", "gcd", "count_bits") and source.selection == "balanced"
    assert [s.config for s in source.mix] == [tasks.canonical_config(tasks.resolve_options(e["name"], e["options"]))
                                              for e in tasks.DEFAULT_MIX]
    assert [r.dataset for r in source.draw(random.Random(0), 8)] == list(source.names) * 2  # one of each, in turn
    default.specialties()[0]["options"]["max_digits"] = 9  # a copy: the embedded mix is not changed through it
    assert tasks.DEFAULT_MIX[0]["options"]["max_digits"] == 2
    one = load_config(toml(tmp_path, '[task]\nname = "gcd"\n[task.options]\nmax_value = 12\n')).task
    assert one.build_source().names == ("gcd",) and one.build_source().options["max_value"] == 12
    with pytest.raises(ConfigError, match=r"^task.options needs task.name \(the dataset the options are for\)$"):
        load_config(toml(tmp_path, "[task.options]\nmax_value = 12\n"))


@pytest.mark.parametrize(("text", "message"), [
    ('mix = [{name = "chain_sum", weight = 0}]', "task.mix[0] ('chain_sum'): weight must be a number > 0, got 0"),
    ('mix = [{name = "chain_sum", weight = -1.5}]', "weight must be a number > 0, got -1.5"),
    ('mix = [{name = "chain_sum"}, {name = "chain_sum", options = {max_terms = 3}}]',
     "task.mix: dataset 'chain_sum' appears twice"),
    ('mix = [{name = "chain_sum", wieght = 2}]', "task.mix[0]: unknown key 'wieght'; known: name, options, weight"),
    ('mix = [{options = {}}]', "task.mix[0] needs a dataset name"),
    ('mix = ["chain_sum"]', "task.mix[0] must be a table"),
    ('mix = [{name = "leg_counting", options = 3}]', "options must be a table"),
    ('name = "leg_counting"\nmix = [{name = "chain_sum"}]', "task.mix replaces task.name and task.options"),
    ('accept = [{name = "chain_sum", weight = 1}]', "task.accept[0]: unknown key 'weight'; known: name, options"),
])
def test_malformed_mix_is_one_config_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(toml(tmp_path, f"[task]\n{text}\n"))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("mix", "accept", "message"), [
    ([{"name": "chain_sum"}, {"name": "no_such_task"}], None, "task.mix[1]: unknown task 'no_such_task'"),
    ([{"name": "chain_sum", "options": {"bogus": 1}}], None, "task.mix[0]: bad options for task 'chain_sum'"),
    (None, [{"name": "no_such_task"}], "task.accept[0]: unknown task 'no_such_task'"),
])
def test_unknown_dataset_or_bad_options_is_one_user_error(mix: list | None, accept: list | None,
                                                          message: str) -> None:
    with pytest.raises(UserError) as err:
        tasks.TaskSource(mix=mix, accept=accept)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_weighted_draws_follow_the_weights() -> None:
    source = tasks.TaskSource(mix=MIX, selection="weighted")
    rng = random.Random(1)
    counts = Counter(r.dataset for _ in range(100) for r in source.draw(rng, 20))
    assert counts["chain_sum"] / 2000 == pytest.approx(0.75, abs=0.04)
    again = tasks.TaskSource(mix=MIX, selection="weighted")
    assert again.draw(random.Random(1), 20) == source.draw(random.Random(1), 20)  # deterministic


def test_balanced_one_of_each_per_round_and_rotation_across_steps() -> None:
    source = tasks.TaskSource(mix=THREE, selection="balanced")
    rng = random.Random(0)
    for _ in range(5):  # a round of 3 prompts: exactly one per specialty
        assert sorted(r.dataset for r in source.draw(rng, 3)) == sorted(source.names)
    # fewer prompts per step than specialties: the rotation continues across steps (by the caller's turn, too)
    one = tasks.TaskSource(mix=THREE, selection="balanced")
    assert [one.draw(rng, 1)[0].dataset for _ in range(6)] == list(one.names) * 2
    assert [one.draw(rng, 2, turn=2 * step)[0].dataset for step in range(3)] == [
        "chain_sum", "leg_counting", "basic_arithmetic"]
    # more prompts than specialties: counts differ by at most one, and even out over steps
    many = Counter(r.dataset for _ in range(3) for r in one.draw(rng, 8, turn=None))
    assert set(many.values()) == {8}


def test_mix_training_draws_skip_held_out_problems() -> None:
    source = tasks.TaskSource(mix=MIX, selection="weighted")
    rng = random.Random(3)
    assert not any(tasks.is_heldout(tasks.instance(r)) for _ in range(30) for r in source.draw(rng, 20))


def _group(ref: tasks.TaskRef, tok: object) -> RolloutGroup:
    inst = tasks.instance(ref)
    comps = tuple(CompletionWire(tuple(tok.encode(t) + [tok.eos_token_id]), t, (-0.5,) * (len(t) + 1), r)
                  for t, r in ((inst.answer, 1.0), ("x", 0.0)))
    return RolloutGroup(b"\x01" * 16, "peerA", 1, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                        comps, tokenizer_hash(tok), "qwen2", 1000.0)


def _training_ref(name: str, config: str) -> tasks.TaskRef:
    refs = (tasks.TaskRef(name, config, 0, i) for i in range(100))
    return next(ref for ref in refs if not tasks.is_heldout(tasks.instance(ref)))


def test_accept_list_wider_than_the_mix_on_the_wire_and_in_rescoring() -> None:
    """We draw only chain_sum but accept basic_arithmetic from peers; leg_counting is not accepted."""
    arith = tasks.canonical_config(SMALL)
    source = tasks.TaskSource(accept=[{"name": "chain_sum"}, {"name": "basic_arithmetic", "options": SMALL}])
    policy = accept_policy_for(source)
    assert policy.tasks == {("chain_sum", source.config), ("basic_arithmetic", arith)}
    check_task_ref(TaskRefWire("basic_arithmetic", arith, 0, 5), policy)
    with pytest.raises(WireError, match="task_not_allowed"):
        check_task_ref(TaskRefWire("leg_counting", "{}", 0, 5), policy)
    assert accept_policy_for(tasks.TaskSource()).tasks == {("chain_sum", source.config)}  # default: own mix
    tok = build_char_tokenizer()
    ctx = ShareContext(tok, tokenizer_hash(tok), source, CompletionBounds(16, 256, len(tok), 2))
    ok = accept_external(_group(_training_ref("basic_arithmetic", arith), tok), "peerA", ctx, 1000.0)
    assert ok.reason == "" and ok.external.group.rewards == (1.0, 0.0)
    not_ours = accept_external(_group(_training_ref("leg_counting", "{}"), tok), "peerA", ctx, 1000.0)
    assert (not_ours.external, not_ours.reason) == (None, "task_not_allowed")


def _scored(dataset: str, rewards: list[float]) -> ScoredGroup:
    inst = tasks.TaskInstance(tasks.TaskRef(dataset, "{}", 0, 0), "q", "a", "q\nAnswer: ", {})
    return ScoredGroup(inst, [1], [Completion([1], "a", [0.0], 0)] * len(rewards), rewards)


def test_per_task_metrics_and_status_snapshot() -> None:
    groups = [_scored("chain_sum", [1.0, 0.0]), _scored("chain_sum", [1.0, 1.0]), _scored("leg_counting", [0.0, 0.5])]
    per_task = per_task_metrics(groups)
    assert per_task == {"chain_sum": {"reward_mean": 0.75, "accuracy": 0.75, "groups": 2},
                        "leg_counting": {"reward_mean": 0.25, "accuracy": 0.0, "groups": 1}}
    stats = NodeStats()
    stats.record_step({"step": 1, "reward_mean": 0.5, "accuracy": 0.5, "per_task": per_task})
    stats.record_step({"step": 2, "per_task": {"chain_sum": {"reward_mean": 0.25, "accuracy": 0.0, "groups": 1}}})
    snap = stats.snapshot()["per_task"]
    assert snap["chain_sum"] == {"reward": {"recent": 0.25, "moving_avg": 0.5},
                                 "accuracy": {"recent": 0.0, "moving_avg": 0.375}, "groups": 3}
    assert snap["leg_counting"]["accuracy"]["recent"] == 0.0 and snap["leg_counting"]["groups"] == 1
