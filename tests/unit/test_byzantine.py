"""Malicious node kinds (simulations/byzantine.py): each forges what it claims to, and our checks catch it where the
contract says they do; the grid's placements; what the tally counts; [[attacker]] in scenarios."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import tomllib

from protocol.codec import encode
from protocol.errors import Verdict
from protocol.limits import Limits
from protocol.messages import TOPIC_ROLLOUTS, RolloutBatch
from protocol.validation import ReplayGuard, validate_gossip
from simulations import variants
from simulations.attack_cell import identity_name
from simulations.attack_grid import grid, placement, summarise
from simulations.attack_live import live_kinds, summarise_live, write_config
from simulations.attack_tally import AttackTally, TallyPool
from simulations.byzantine import ATTACKS, ForgeContext, fair, junk_text
from simulations.results import cell_fingerprint
from simulations.scenario import parse_scenario
from swarm_node import tasks
from swarm_node.errors import UserError
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.exchange import accept_policy_for
from swarm_node.sharing.pool import ExperiencePool
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external
from swarm_node.types import PoolEntry

NOW = 1_700_000_000.0
TOK = build_char_tokenizer()
SOURCE = tasks.TaskSource()
G, MAX_NEW = 8, 8
CTX = ForgeContext(TOK, tokenizer_hash(TOK), "qwen2", SOURCE, G, MAX_NEW, len(TOK), 600.0)
BOUNDS = CompletionBounds(max_completion_tokens=MAX_NEW, max_context=256, vocab_size=len(TOK), group_size=G)
SHARE = ShareContext(TOK, tokenizer_hash(TOK), SOURCE, BOUNDS)
LIMITS = Limits(vocab_size=len(TOK))


def forge(kind: str, seed: int = 0, seen: list | None = None) -> list:
    return ATTACKS[kind].forge(CTX, random.Random(seed), "mallory", NOW, seen if seen is not None else [])


def wire_verdict(group: object) -> str:
    data = encode(RolloutBatch((group,)))  # type: ignore[arg-type]
    result = validate_gossip(TOPIC_ROLLOUTS, data, "mallory", limits=LIMITS, policy=accept_policy_for(SOURCE),
                             now=NOW, replay=ReplayGuard(LIMITS.max_age_s))
    return "" if result.verdict is Verdict.ACCEPT else result.reason


def test_every_declared_attack_is_registered() -> None:
    assert ATTACKS.names == variants.ATTACKS
    assert sorted(ATTACKS) == sorted(variants.ATTACKS)
    assert {k: (ATTACKS[k].per_round, ATTACKS[k].rotate_rounds) for k in ("stale", "sybil", "junk")} == {
        "stale": (32, 0), "sybil": (8, 2), "junk": (4, 0)}


def test_forged_rewards_are_rescored_and_flagged() -> None:
    [group] = forge("forged_reward")
    assert wire_verdict(group) == ""
    assert [c.claimed_reward for c in group.completions] == [0.0] * 4 + [1.0] * 4
    outcome = accept_external(group, "mallory", SHARE, NOW)
    assert outcome.forged_reward and outcome.external is not None
    assert outcome.external.group.rewards == (1.0,) * 4 + (0.0,) * 4  # ours, never the claims


def test_out_of_vocabulary_ids_stop_at_the_wire_and_garbage_has_no_signal() -> None:
    verdicts = []
    for seed in range(6):
        [group] = forge("oov_tokens", seed)
        verdict = wire_verdict(group)
        verdicts.append(verdict)
        if not verdict:  # in-vocabulary garbage: passes the wire, never earns a reward
            assert all(t < len(TOK) for c in group.completions for t in c.token_ids)
            assert accept_external(group, "mallory", SHARE, NOW).reason in ("zero_advantage", "token_out_of_vocab")
    assert "" in verdicts and set(verdicts) - {""}  # both halves of the attack occur


def test_maximal_length_passes_the_wire_and_stops_at_our_bounds() -> None:
    [group] = forge("over_length")
    assert max(len(c.token_ids) for c in group.completions) == 4096
    assert wire_verdict(group) == ""
    assert accept_external(group, "mallory", SHARE, NOW).reason == "over_length"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_junk_passes_the_verifier_and_only_the_well_formed_defence_stops_it(seed: int) -> None:
    [group] = forge("junk", seed)
    assert wire_verdict(group) == ""
    inst = tasks.instance(tasks.TaskRef(group.task.dataset, group.task.config, group.task.seed, group.task.index))
    for c in group.completions[:4]:
        assert len(c.token_ids) == MAX_NEW and c.text.startswith(inst.answer)
        assert tasks.score(inst, c.text) == 1.0  # the verifier reads the first line
    defended = accept_external(group, "mallory", SHARE, NOW)
    assert (defended.external, defended.reason, defended.malformed) == (None, "zero_advantage", 4)
    undefended = accept_external(group, "mallory", dataclasses.replace(SHARE, require_well_formed=False), NOW)
    assert undefended.external is not None and undefended.external.group.rewards == (1.0,) * 4 + (0.0,) * 4


def test_junk_text_fills_the_budget() -> None:
    texts = {junk_text(CTX, "12", random.Random(s)) for s in range(20)}
    assert all(len(TOK.encode(t)) == MAX_NEW - 1 and t.startswith("12") for t in texts)
    assert "12     " in texts and any("\n" in t for t in texts)


def test_stale_groups_are_stale() -> None:
    groups = [g for _ in range(ATTACKS["stale"].per_round) for g in forge("stale")]
    assert len(groups) == 32 and {g.created_at for g in groups} == {NOW - 660.0}
    assert accept_external(groups[0], "mallory", SHARE, NOW).reason == "stale"
    assert wire_verdict(groups[0]) == "stale"


def test_a_replay_is_someone_elses_content_under_the_attackers_name() -> None:
    [original] = fair(CTX, random.Random(5), "alice", NOW - 5, [])
    seen = [original]
    [copy] = forge("replay", seen=seen)
    assert seen == [] and forge("replay", seen=seen) == []
    assert (copy.policy_id, copy.created_at) == ("mallory", NOW) and copy.group_id != original.group_id
    key = accept_external(copy, "mallory", SHARE, NOW).external.key  # type: ignore[union-attr]
    assert key == accept_external(original, "alice", SHARE, NOW).external.key  # type: ignore[union-attr]


def test_a_sybil_rotates_its_identity() -> None:
    assert [identity_name(3, "sybil", r) for r in range(5)] == ["node3s0", "node3s0", "node3s1", "node3s1", "node3s2"]
    assert identity_name(3, "junk", 7) == "node3"


def test_placement_keeps_the_honest_nodes_of_every_fraction_paired() -> None:
    assert placement(10, 0.0, 0, 5) == ()
    assert placement(10, 0.1, 0, 5) == ((9, "forged_reward"),)
    assert placement(10, 0.3, 1, 5) == ((7, "replay"), (8, "sybil"), (9, "forged_reward"))
    assert placement(10, 0.5, 2, 5) == ((5, "junk"), (6, "stale"), (7, "replay"), (8, "sybil"),
                                        (9, "forged_reward"))
    assert placement(4, 0.1, 0, 2) == ((3, "forged_reward"),)  # a positive fraction is at least one node
    kinds = {k for s in range(3) for _, k in placement(10, 0.5, s, 5)}
    assert kinds == set(variants.ATTACKS)  # three seeds cover every kind


def scenario(attackers: list | None = None, mode: str = "attack") -> dict:
    data: dict = {"simulation": {"nodes": 4, "mode": mode, "seeds": [0, 1]},
                  "config": {"share": {"external_groups": 2}}}
    if attackers is not None:
        data["attacker"] = attackers
    return data


def test_the_grid_of_cells() -> None:
    scn = parse_scenario(scenario(), "t")
    cells = grid(scn, (0.0, 0.5), (0, 1))
    assert [(c.variant.name, c.seed, c.scenario.attackers) for c in cells] == [
        ("f0.0", 0, ()), ("f0.5", 0, ((2, "forged_reward"), (3, "oov_tokens"))), ("solo", 0, ()),
        ("junk-defended", 0, ((3, "junk"),)), ("junk-undefended", 0, ((3, "junk"),)),
        ("f0.0", 1, ()), ("f0.5", 1, ((2, "over_length"), (3, "junk"))), ("solo", 1, ()),
        ("junk-defended", 1, ((3, "junk"),)), ("junk-undefended", 1, ((3, "junk"),))]
    configs = {c.variant.name: c.variant.config for c in cells}  # over the scenario's [config]
    assert configs == {"f0.0": {}, "f0.5": {}, "solo": {"share": {"external_groups": 0}}, "junk-defended": {},
                       "junk-undefended": {"share": {"require_well_formed": False}}}


def test_scenario_attackers_are_checked() -> None:
    assert parse_scenario(scenario([{"index": 3, "kind": "junk"}, {"index": 1, "kind": "stale"}]),
                          "t").attackers == ((1, "stale"), (3, "junk"))
    for attackers, message in [
        ([{"index": 4, "kind": "junk"}], "attacker[0].index must be in [0, 4), got 4"),
        ([{"index": 1, "kind": "evil"}], "attacker[0].kind must be one of forged_reward, oov_tokens, over_length, "
                                         "junk, stale, replay, sybil, not 'evil'"),
        ([{"index": 1, "kind": "junk"}, {"index": 1, "kind": "stale"}], "[[attacker]] indices must be distinct"),
        ([{"index": i, "kind": "junk"} for i in range(4)], "needs at least one honest node"),
        ([{"index": 1, "kind": "junk", "x": 1}], "unknown key 'x' in attacker[0]"),
    ]:
        with pytest.raises(UserError, match=None) as err:
            parse_scenario(scenario(attackers), "t")
        assert message in str(err.value)
    with pytest.raises(UserError, match=r"\[\[attacker\]\] needs simulation.mode 'attack', not 'sync'"):
        parse_scenario(scenario([{"index": 1, "kind": "junk"}], mode="sync"), "t")


def test_fingerprints_of_scenarios_without_attackers_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    import simulations.results as results

    hashed: list[dict] = []
    real = results.json.dumps

    def spy(obj: object, **kwargs: object) -> str:
        hashed.append(obj)  # type: ignore[arg-type]
        return real(obj, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(results.json, "dumps", spy)
    scn = parse_scenario(scenario(mode="sync"), "t")
    attacked = dataclasses.replace(parse_scenario(scenario(), "t"), attackers=((3, "junk"),))
    cell_fingerprint(scn, scn.variants[0])
    cell_fingerprint(attacked, scn.variants[0])
    cells = [h for h in hashed if isinstance(h, dict) and "variant" in h]  # what a fingerprint hashes
    assert len(cells) == 2
    assert "attackers" not in cells[0]  # as before the field existed: stored cells stay valid
    assert cells[1]["attackers"] == ((3, "junk"),)


def entry(sender: str, key: bytes, rewards: list[float]) -> PoolEntry:
    [group] = fair(CTX, random.Random(key[0]), sender, NOW, [])
    ext = accept_external(group, sender, SHARE, NOW).external
    assert ext is not None
    return PoolEntry(dataclasses.replace(ext.group, rewards=rewards), sender, key, 0, False)


def test_the_tally_counts_what_reached_the_loss() -> None:
    tally = AttackTally()
    pool = TallyPool.like(ExperiencePool(16, 8, 4))
    tally.watch(pool)
    for peer, kind in [("node3", "forged_reward"), ("node4", "junk")]:
        tally.identity(peer, kind)
    tally.claimed(b"\1" * 32, [0.0, 1.0])  # a claim that reached the loss
    tally.claimed(b"\2" * 32, [1.0, 0.0])  # re-scored: our rewards differ from the claim
    for e in [entry("node3", b"\1" * 32, [0.0, 1.0]), entry("node3", b"\2" * 32, [0.0, 1.0]),
              entry("node4", b"\3" * 32, [1.0, 0.0]), entry("node0", b"\4" * 32, [1.0, 0.0])]:
        pool.add(e)
    assert len(pool.take(10, "uniform", random.Random(0))) == 4
    assert (tally.external, dict(tally.trained), dict(tally.bad)) == (
        4, {"forged_reward": 2, "junk": 1}, {"forged_reward": 1, "junk": 1})
    # A replay counts as bad only if the node had trained on or published that content before (the pool's dedup
    # refuses both, so `took` is called directly); a replay of another attacker's content it never saw is counted.
    tally.identity("node5", "replay")
    pool.mark_seen([b"\5" * 32])
    assert pool.before == {b"\1" * 32, b"\2" * 32, b"\3" * 32, b"\4" * 32, b"\5" * 32}
    tally.took([entry("node5", b"\5" * 32, [1.0, 0.0]), entry("node5", b"\1" * 32, [0.0, 1.0]),
                entry("node5", b"\6" * 32, [0.0, 1.0])], {b"\5" * 32})
    restored = AttackTally.from_state(json.loads(json.dumps(tally.state())))
    assert restored.result() == tally.result() == {
        "bad_groups_trained": {"forged_reward": 1, "junk": 1, "replay": 1},
        "attacker_groups_trained": {"forged_reward": 2, "junk": 1, "replay": 3}, "external_groups_trained": 7,
        "replays_of_attackers": 1,
        "rounds_to_block": {"forged_reward": [None], "junk": [None], "replay": [None]}}


def test_summarise_pairs_nodes_and_seeds() -> None:
    def cell(variant: str, seed: int, accs: dict, bad: dict | None = None, ext: float = 4.0) -> dict:
        return {"variant": variant, "seed": seed, "final_eval_acc": sum(accs.values()) / len(accs),
                "final_eval_acc_per_node": accs, "external_groups_trained_per_step": ext,
                "bad_groups_trained": bad or {}, "rounds_to_block": {}}
    results = [cell("f0.0", 0, {"0": 0.5, "1": 0.3}), cell("f0.5", 0, {"0": 0.4}, {"junk": 0}, 2.0),
               cell("solo", 0, {"0": 0.2, "1": 0.1}), cell("junk-defended", 0, {"0": 0.4}, {"junk": 0}),
               cell("junk-undefended", 0, {"0": 0.1}, {"junk": 7})]
    out = summarise(results, (0.0, 0.5))
    assert out["honest_eval_acc"] == {"0.0": 0.4, "0.5": 0.4}
    assert out["honest_eval_vs_clean"]["0.0"] == 0.0
    assert out["honest_eval_vs_clean"]["0.5"] == pytest.approx(-0.1)
    assert out["honest_solo_eval_acc"] == {"0.0": pytest.approx(0.15), "0.5": 0.2}
    assert out["external_groups_trained_per_step"] == {"0.0": 4.0, "0.5": 2.0}
    assert (out["bad_groups_trained"], out["junk_groups_trained"]) == ({"junk": 0}, {"with_defence": 0,
                                                                                      "without": 7})
    assert out["fractions"] == [0.0, 0.5] and out["kinds"] == ["junk"]
    assert out["honest_eval_vs_solo"] == {"0.0": pytest.approx(0.25), "0.5": pytest.approx(0.2)}
    assert out["honest_eval_paired_se"] == {"vs_clean": {"0.0": None, "0.5": None},
                                            "vs_solo": {"0.0": None, "0.5": None}}  # one seed: no spread


def test_summarise_standard_error_is_over_seeds() -> None:
    def cell(variant: str, seed: int, accs: dict) -> dict:
        return {"variant": variant, "seed": seed, "final_eval_acc": sum(accs.values()) / len(accs),
                "final_eval_acc_per_node": accs, "external_groups_trained_per_step": 4.0,
                "bad_groups_trained": {}, "rounds_to_block": {}}
    # seed 0: node 0 gains 0.1 and node 1 loses 0.3 over solo (seed mean -0.1); seed 1: both gain 0.1 (mean +0.1)
    results = [cell("f0.5", 0, {"0": 0.5, "1": 0.1}), cell("solo", 0, {"0": 0.4, "1": 0.4}),
               cell("f0.5", 1, {"0": 0.3, "1": 0.3}), cell("solo", 1, {"0": 0.2, "1": 0.2})]
    out = summarise(results, (0.5,))
    assert out["honest_eval_paired_per_seed"]["vs_solo"]["0.5"] == {"0": pytest.approx(-0.1),
                                                                     "1": pytest.approx(0.1)}
    assert out["honest_eval_vs_solo"]["0.5"] == pytest.approx(0.0)
    # stdev of (-0.1, 0.1) is 0.1 * sqrt(2); over sqrt(2) seeds: 0.1
    assert out["honest_eval_paired_se"]["vs_solo"]["0.5"] == pytest.approx(0.1)
    assert out["honest_eval_paired_per_seed"]["vs_clean"]["0.5"] == {}  # no clean cell to pair with
    assert out["honest_eval_vs_clean"]["0.5"] is None


def test_f50_against_alone_pairs_the_honest_nodes_per_question_then_seeds() -> None:
    def cell(variant: str, seed: int, outcomes: dict) -> dict:
        accs = {n: sum(o.values()) / len(o) for n, o in outcomes.items()}
        return {"variant": variant, "seed": seed, "final_eval_acc": sum(accs.values()) / len(accs),
                "final_eval_acc_per_node": accs, "final_eval_outcomes_per_node": outcomes,
                "external_groups_trained_per_step": 4.0, "bad_groups_trained": {}, "rounds_to_block": {}}
    # Honest nodes 0 and 1; the solo cell also holds node 2 (an attacker's index in f0.5), which must not count.
    # Per question, the honest nodes' mean minus the same nodes' mean alone: q1 (1+1)/2 - (0+1)/2 = 0.5,
    # q2 (0+1)/2 - (0+0)/2 = 0.5, q3 0 - 0 = 0: a mean of 1/3 for both seeds (seed 1 is seed 0 relabelled).
    swarm = {"0": {"q1": 1.0, "q2": 0.0, "q3": 0.0}, "1": {"q1": 1.0, "q2": 1.0, "q3": 0.0}}
    alone = {"0": {"q1": 0.0, "q2": 0.0, "q3": 0.0}, "1": {"q1": 1.0, "q2": 0.0, "q3": 0.0},
             "2": {"q1": 1.0, "q2": 1.0, "q3": 1.0}}
    results = [cell("f0.5", s, swarm) for s in (0, 1)] + [cell("solo", s, alone) for s in (0, 1)]
    out = summarise(results, (0.5,))
    paired = out["f50_vs_alone_paired"]
    assert paired["diff"] == pytest.approx(1 / 3)
    assert (paired["seeds"], paired["questions"]) == (2, 3)
    low, high = paired["ci95"]  # questions resampled: per-question gains are 0.5, 0.5 and 0
    assert 0.0 <= low <= 1 / 3 <= high <= 0.5
    assert out["honest_eval_vs_solo_paired"] == {"0.5": paired}


def test_f50_against_alone_is_none_without_per_question_outcomes() -> None:
    accs = {"0": 0.5}
    results = [{"variant": v, "seed": 0, "final_eval_acc": 0.5, "final_eval_acc_per_node": accs,
                "external_groups_trained_per_step": 4.0, "bad_groups_trained": {}, "rounds_to_block": {}}
               for v in ("f0.5", "solo")]
    assert summarise(results, (0.5,))["f50_vs_alone_paired"] is None


def test_every_kind_runs_live_at_some_fraction() -> None:
    kinds = live_kinds(10, (0.0, 0.1, 0.3, 0.5))
    assert kinds == {0.0: [], 0.1: ["over_length"], 0.3: ["sybil", "forged_reward", "oov_tokens"],
                     0.5: ["junk", "stale", "replay", "over_length", "sybil"]}
    assert {k for ks in kinds.values() for k in ks} == set(variants.ATTACKS)


def test_summarise_live_pairs_each_round_with_its_own_clean_run() -> None:
    def run(rss: float, spm: float, blocks: dict | None = None) -> dict:
        return {"max_rss_mib": rss, "steps_per_min": spm, "time_to_block_s": blocks or {}}
    rounds = [{"0.0": run(900.0, 40.0), "0.5": run(950.0, 20.0, {"junk": [2.0], "sybil": [1.0, None]})},
              {"0.0": run(920.0, 30.0), "0.5": run(930.0, 24.0, {"junk": [4.0]})},
              {"0.0": run(910.0, 36.0), "0.5": run(990.0, 27.0, {"junk": [3.0, 9.0]})}]
    out = summarise_live(rounds)
    # ratios 20/40 = 0.5, 24/30 = 0.8, 27/36 = 0.75: median 0.75 (the median of the raw rates would pair nothing)
    assert out["steps_per_min_vs_clean_per_repeat"] == {"0.0": [1.0, 1.0, 1.0], "0.5": [0.5, 0.8, 0.75]}
    assert out["steps_per_min_vs_clean"] == {"0.0": 1.0, "0.5": 0.75}
    assert out["max_rss_mib"] == {"0.0": 920.0, "0.5": 990.0}  # the worst round
    assert out["time_to_graylist_s"] == {"junk": 3.5, "sybil": 1.0}  # median of 2, 4, 3, 9; never-blocked left out
    assert out["live_never_graylisted"] == ["sybil"]
    assert out["live_runs"] == rounds


def test_live_node_config_is_toml(tmp_path: Path) -> None:
    path = write_config(tmp_path / "n.toml", {"run": {"steps": 5}, "share": {"require_well_formed": False},
                                                         "task": {"mix": [{"name": "gcd", "options": {"a": 1}}]}})
    assert tomllib.loads(path.read_text()) == {"run": {"steps": 5}, "share": {"require_well_formed": False},
                                               "task": {"mix": [{"name": "gcd", "options": {"a": 1}}]}}


def test_live_peer_roles() -> None:
    from simulations.attack_peers import parse_role

    kind, attack = parse_role("fair:40")
    assert (kind, attack.per_round, attack.rotate_rounds) == ("fair", 40, 0)
    kind, attack = parse_role("sybil")
    assert (kind, attack.per_round, attack.rotate_rounds) == ("sybil", 8, 2)
    with pytest.raises(KeyError, match="unknown attack 'evil'"):
        parse_role("evil")


def test_the_well_formed_defence_is_on_unless_switched_off_for_a_measurement(tmp_path: Path) -> None:
    from swarm_node.config import NodeConfig, load_config

    assert NodeConfig().share.require_well_formed is True
    path = write_config(tmp_path / "off.toml", {"share": {"require_well_formed": False}})
    assert load_config(path).share.require_well_formed is False
