"""Difficulty-targeted prompts: pass-rate estimates (a peer's share bounded), the adaptive selection, DARS rollout
allocation, groups of other sizes from peers, and the scoring down of a peer whose pass rates disagree with ours."""

from __future__ import annotations

import dataclasses
import random

import pytest

from swarm_node import tasks
from swarm_node.config import build_config
from swarm_node.errors import ConfigError
from swarm_node.node.resume import RandomStreams
from swarm_node.sharing.exchange import Received
from swarm_node.sharing.ingest import Ingest, PeerGuard
from swarm_node.sharing.reputation import Reputation
from swarm_node.sharing.rescore import accept_external
from swarm_node.status.stats import NodeStats
from swarm_node.tasks.allocation import ROLLOUT_ALLOCATIONS
from swarm_node.tasks.pass_rates import PassRateBook, PassRateParams
from swarm_node.tasks.selection import ADAPTIVE_CANDIDATES, ADAPTIVE_REPLAY, adaptive_probabilities, select_adaptive
from tests.unit.test_sharing import BOUNDS, CTX, NOW, SOURCE, completion, wire

A = tasks.TaskRef("chain_sum", "{}", 0, 1)
A2 = tasks.TaskRef("chain_sum", "{}", 0, 2)
A3 = tasks.TaskRef("chain_sum", "{}", 0, 3)


# -- the estimates --------------------------------------------------------------------------------------------------
def test_own_outcomes_update_a_beta_posterior() -> None:
    book = PassRateBook()  # Beta(1, 1)
    assert book.family_rate("chain_sum", "{}") == 0.5
    book.record(A, [1.0, 1.0, 1.0, 0.0])
    assert book.family_rate("chain_sum", "{}") == pytest.approx(4 / 6)
    assert book.rate(A) == pytest.approx((4 / 6 * 2 + 3) / 6)  # the family's rate is the instance's prior
    book.record(A2, [1.0, 1.0, 1.0, 1.0])
    assert book.family_rate("chain_sum", "{}") == pytest.approx(8 / 10)
    assert book.rate(A2) == pytest.approx((0.8 * 2 + 4) / 6)
    assert book.rate(A3) == pytest.approx(0.8)  # never seen: its family's
    book.record(A3, [0.3, 2.0, -1.0])  # partial credit counts, clipped to [0, 1]
    assert book.family_rate("chain_sum", "{}") == pytest.approx((1 + 7 + 1.3) / (2 + 11))


def test_one_peer_makes_at_most_its_share_of_an_estimate() -> None:
    book = PassRateBook(PassRateParams(peer_share=0.25))
    book.record(A, [1.0, 1.0, 1.0, 0.0])
    book.record(A, [0.0] * 100, peer="liar")  # counts as 2 trials: 2 / (2 + 4 + 2) = 25%
    assert book.family_rate("chain_sum", "{}") == pytest.approx(4 / 8)
    book.record(A, [1.0] * 100, peer="other")  # another peer, capped the same
    assert book.family_rate("chain_sum", "{}") == pytest.approx(6 / 10)


def test_peers_alone_move_an_estimate_by_a_share_of_the_prior_only() -> None:
    book = PassRateBook(PassRateParams(peer_share=0.25))
    book.record(A, [1.0] * 10, peer="peerA")  # cap 2 * 1/3 trials
    assert book.family_rate("chain_sum", "{}") == pytest.approx((1 + 2 / 3) / (2 + 2 / 3))
    assert PassRateBook(PassRateParams(peer_share=0.0)).family_rate("chain_sum", "{}") == 0.5


def test_a_peer_whose_rates_disagree_with_ours_is_flagged_once() -> None:
    book = PassRateBook(PassRateParams(disagree_gap=0.5, disagree_instances=4, min_trials=2))
    refs = [tasks.TaskRef("chain_sum", "{}", 0, i) for i in range(5)]
    for ref in refs:
        book.record(ref, [0.0, 0.0])
    for ref in refs[:3]:
        book.record(ref, [1.0, 1.0], peer="liar")
    book.record(refs[3], [1.0], peer="liar")  # one trial: not enough to count as shared
    assert not book.disagreeing("liar")
    book.record(refs[3], [1.0], peer="liar")
    assert book.disagreeing("liar")
    assert book.newly_disagreeing("liar") and not book.newly_disagreeing("liar")
    book.record(refs[4], [0.0, 0.0], peer="honest")
    assert not book.disagreeing("honest")


def test_the_book_round_trips_through_the_checkpointed_streams() -> None:
    book = PassRateBook()
    book.record(A, [1.0, 0.0])
    book.record(A2, [1.0, 1.0], peer="peerA")
    streams = RandomStreams(random.Random(1), random.Random(2), random.Random(3), book)
    state = streams.state()
    again = RandomStreams(random.Random(0), random.Random(0), random.Random(0), PassRateBook())
    again.set_state(state)
    assert again.book is not None and again.book.state() == book.state()
    assert again.book.rate(A2) == book.rate(A2) and again.book.family_rate("chain_sum", "{}") == 0.625
    assert "pass_rates" not in RandomStreams(random.Random(1), random.Random(2), random.Random(3),
                                             PassRateBook()).state()


def test_the_book_forgets_the_oldest_instance_past_its_cap() -> None:
    book = PassRateBook(PassRateParams(max_instances=2))
    for ref in (A, A2, A3):
        book.record(ref, [1.0, 0.0])
    assert list(book.instances) == [A2, A3] and book.families[("chain_sum", "{}")][""] == [3.0, 6.0]
    assert book.replayable("chain_sum", "{}", 0) == [(2, 0.5), (3, 0.5)]  # the forgotten one is no candidate


def test_replay_candidates_are_own_mixed_instances_under_the_trial_cap_in_the_order_they_qualified() -> None:
    book = PassRateBook(PassRateParams(replay_trials=6))
    book.record(A, [1.0, 1.0])  # solved so far: no candidate
    book.record(A2, [1.0, 0.0, 0.0, 0.0])  # mixed: a candidate
    book.record(A3, [1.0, 0.0], peer="peerA")  # a peer's mixed group: never a candidate
    other_seed = tasks.TaskRef("chain_sum", "{}", 7, 2)
    book.record(other_seed, [1.0, 0.0])  # another seed's stream: not this one's candidate
    book.record(A, [0.0])  # now mixed (2 of 3): a candidate after A2
    # family: prior 1 of 2, own 4 passes of 9 (A 2/3, A2 1/4, other seed 1/2), the peer's 1/2 under its cap of
    # (2 + 9) / 3 trials
    family = (1 + 4 + 1) / (2 + 9 + 2)
    assert book.family_rate("chain_sum", "{}") == pytest.approx(family)
    assert book.replayable("chain_sum", "{}", 0) == [(2, pytest.approx((2 * family + 1) / 6)),
                                                     (1, pytest.approx((2 * family + 2) / 5))]
    book.record(A2, [1.0, 1.0])  # 6 own trials: at the cap, no longer replayed
    family = (1 + 6 + 1) / (2 + 11 + 2)
    assert book.replayable("chain_sum", "{}", 0) == [(1, pytest.approx((2 * family + 2) / 5))]
    again = PassRateBook(PassRateParams(replay_trials=6))
    book.record(A3, [0.0, 1.0])  # own mixed after the peer's: joins last
    again.set_state(book.state())
    assert again.replayable("chain_sum", "{}", 0) == book.replayable("chain_sum", "{}", 0)
    assert [i for i, _ in again.replayable("chain_sum", "{}", 0)] == [1, 3]


# -- the adaptive selection -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Rates:
    families: tuple[float, ...]
    by_index: dict[int, float] = dataclasses.field(default_factory=dict)
    replay: tuple[int, ...] = ()  # indices of by_index that are replay candidates

    def family(self, specialty: int) -> float:
        return self.families[specialty]

    def instance(self, specialty: int, index: int) -> float:
        return self.by_index.get(index, self.families[specialty])

    def replayable(self, specialty: int) -> list[tuple[int, float]]:
        return [(i, rate) for i, rate in self.by_index.items() if i in self.replay]


def test_adaptive_probabilities_favour_moderate_pass_rates_with_a_floor() -> None:
    probs = adaptive_probabilities(Rates((0.5, 0.9, 1.0, 0.0)), 4)
    assert probs == pytest.approx([0.05 + 0.8 * 0.25 / 0.34, 0.05 + 0.8 * 0.09 / 0.34, 0.05, 0.05])
    assert adaptive_probabilities(Rates((1.0, 0.0)), 2) == [0.5, 0.5]  # no signal anywhere: uniform
    assert adaptive_probabilities(None, 3) == [1 / 3, 1 / 3, 1 / 3]


def test_adaptive_picks_for_a_seeded_rng() -> None:
    rates = Rates((0.5, 0.99, 1.0))
    picks = select_adaptive(random.Random(5), (1.0, 1.0, 1.0), 1000, 6, 0, rates)
    assert picks == PICKS_SEED_5
    # the same draws replayed: one random() per specialty, then the candidates (all equal here: the first)
    replay = random.Random(5)
    probs = adaptive_probabilities(rates, 3)
    for specialty, index in picks:
        u = replay.random()
        assert specialty == next(s for s in range(3) if u < sum(probs[:s + 1]))
        assert index == [replay.randrange(1000) for _ in range(ADAPTIVE_CANDIDATES)][0]


PICKS_SEED_5 = [(0, 759), (2, 757), (0, 476), (0, 922), (0, 252), (0, 13)]


def test_the_floor_keeps_a_solved_specialty_drawn() -> None:
    picks = select_adaptive(random.Random(0), (1.0, 1.0), 10, 4000, 0, Rates((0.5, 1.0)))
    solved = sum(s == 1 for s, _ in picks)
    assert solved == SOLVED_DRAWS_SEED_0  # about the floor's 0.2 / 2 = 10%


SOLVED_DRAWS_SEED_0 = 388


def test_adaptive_takes_the_candidate_of_most_signal() -> None:
    size = 1000
    rng = random.Random(11)
    candidates = [rng.randrange(size) for _ in range(ADAPTIVE_CANDIDATES)]
    rates = Rates((1.0,), {candidates[2]: 0.5, candidates[3]: 0.6})
    # a mix of one: no specialty draw, only the candidates
    assert select_adaptive(random.Random(11), (1.0,), size, 1, 0, rates) == [(0, candidates[2])]


def test_adaptive_replays_the_candidate_of_most_signal_half_the_time_and_never_twice_a_call() -> None:
    rates = Rates((0.5,), {7: 0.9, 8: 0.4, 9: 0.6}, replay=(7, 8, 9))
    picks = select_adaptive(random.Random(2), (1.0,), 1000, 4, 0, rates)
    # replayed by hand: a mix of one draws no specialty; each pick draws random() for the replay while a candidate
    # is left, and its candidates' indices when it does not replay
    rng, expected, left = random.Random(2), [], [8, 9, 7]  # by v: 0.4 and 0.6 tie at 0.24 (the first), then 0.09
    for _ in range(4):
        if left and rng.random() < ADAPTIVE_REPLAY:
            expected.append((0, left.pop(0)))
        else:
            expected.append((0, [rng.randrange(1000) for _ in range(ADAPTIVE_CANDIDATES)][0]))
    assert picks == expected == REPLAY_PICKS_SEED_2


REPLAY_PICKS_SEED_2 = [(0, 970), (0, 8), (0, 753), (0, 9)]


def test_a_source_with_the_adaptive_selection_reads_its_book() -> None:
    source = tasks.TaskSource(selection="adaptive", mix=[{"name": "chain_sum"}, {"name": "basic_arithmetic"}])
    assert source.reads_rates and not tasks.TaskSource().reads_rates
    for _ in range(50):
        source.book.record(tasks.TaskRef("chain_sum", source.mix[0].config, 0, 1), [1.0] * 8)
    refs = source.draw(random.Random(3), 200)
    assert sum(r.dataset == "chain_sum" for r in refs) == CHAIN_SUM_DRAWS  # solved: about the floor's 10%


CHAIN_SUM_DRAWS = 23


def test_a_source_replays_an_instance_whose_own_group_had_signal_up_to_the_trial_cap() -> None:
    source = tasks.TaskSource(selection="adaptive", mix=[{"name": "chain_sum"}])
    ref = source.draw(random.Random(0), 1)[0]
    source.book.record(ref, [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    rng, replays = random.Random(4), 0
    while source.book.replayable(ref.dataset, ref.config, ref.seed):
        drawn = source.draw(rng, 1)[0]
        if drawn == ref:  # replayed: its group again (8 more own trials); at 24 it leaves the candidates
            replays += 1
            source.book.record(ref, [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert replays == 2 and source.book.instances[ref][""] == [6.0, 24.0]


# -- DARS rollout allocation ----------------------------------------------------------------------------------------
def test_dars_gives_more_completions_to_hard_unsolved_prompts_within_the_budget() -> None:
    dars = ROLLOUT_ALLOCATIONS["dars"]
    # u = (1 - rate) ** G = 1, 1/16, 0, 1e-4: 8 extra completions, 6 to the unsolved one (its ceiling), 2 next
    assert dars.allocate([0.0, 0.5, 1.0, 0.9], 4) == [8, 4, 2, 2]
    # u = 1, 1/256, 0, 0.9 ** 8 = 0.43: 16 extra, by D'Hondt's quotients 11 and 5
    assert dars.allocate([0.0, 0.5, 1.0, 0.1], 8) == [15, 4, 4, 9]
    assert dars.allocate([0.07, 0.19, 0.07, 0.19], 6) == [7, 5, 7, 5]  # 5% vs 20% told apart
    assert dars.allocate([1.0, 1.0, 1.0, 1.0], 4) == [4, 4, 4, 4]  # all solved: G each
    assert dars.allocate([0.2, 0.2, 0.2], 8) == [8, 8, 8]
    assert dars.allocate([0.0, 1.0, 1.0], 8) == [16, 4, 4]  # the ceiling 2G, the rest stays at the floor
    assert dars.allocate([0.0, 1.0, 1.0, 1.0, 1.0], 8) == [16, 6, 6, 6, 6]  # past the ceiling: shared out
    assert dars.allocate([0.0, 0.5], 2) == [2, 2]  # floor 2 = G: nothing to move
    assert dars.allocate([0.0, 0.5], 1) == [1, 1]
    for rates, g in (([0.0, 0.5, 1.0, 0.9], 4), ([0.1] * 7, 5), ([0.0, 0.3, 0.6, 0.9, 1.0], 8)):
        assert sum(dars.allocate(rates, g)) == len(rates) * g
    assert (dars.largest(8), ROLLOUT_ALLOCATIONS["fixed"].largest(8)) == (16, 8)
    assert ROLLOUT_ALLOCATIONS["fixed"].allocate([0.0, 1.0], 8) == [8, 8]


def test_config_names_the_allocation_and_the_selection() -> None:
    cfg = build_config([({"run": {"rollout_allocation": "dars"},
                          "task": {"selection": "adaptive", "adaptive_from_peers": True}}, "test")])
    assert (cfg.run.rollout_allocation, cfg.task.selection, cfg.task.adaptive_from_peers) == ("dars", "adaptive", True)
    default = build_config([])
    assert (default.run.rollout_allocation, default.task.adaptive_from_peers) == ("fixed", False)
    with pytest.raises(ConfigError, match="rollout_allocation"):
        build_config([({"run": {"rollout_allocation": "more"}}, "test")])


# -- groups of other sizes from peers -------------------------------------------------------------------------------
ADVANTAGES_1_0_0 = (2 ** 0.5, -(0.5 ** 0.5), -(0.5 ** 0.5))  # GRPO: (r - 1/3) / sqrt(2/9)


def test_a_group_of_g_plus_one_is_taken_and_one_over_the_bounds_is_not() -> None:
    g_plus_one = wire(completion("6", 1.0), completion("7", 0.0), completion("8", 0.0))
    taken = accept_external(g_plus_one, "peerA", dataclasses.replace(CTX, bounds=dataclasses.replace(
        BOUNDS, max_group_completions=3)), NOW)
    assert taken.reason == "" and taken.external.group.rewards == (1.0, 0.0, 0.0)
    assert taken.external.group.advantages == pytest.approx(ADVANTAGES_1_0_0)
    assert len(taken.external.group.completions) == 3
    too_many = wire(*[completion("7", 0.0)] * 3, completion("6", 1.0))
    assert accept_external(too_many, "peerA", dataclasses.replace(CTX, bounds=dataclasses.replace(
        BOUNDS, max_group_completions=3)), NOW).reason == "group_size"
    # 3 completions of 2 ids each: 6 ids, one over a bound of 5
    tokens = dataclasses.replace(BOUNDS, max_group_completions=3, max_group_tokens=5)
    assert accept_external(g_plus_one, "peerA", dataclasses.replace(CTX, bounds=tokens), NOW).reason == "group_tokens"
    assert accept_external(g_plus_one, "peerA", dataclasses.replace(CTX, bounds=dataclasses.replace(
        tokens, max_group_tokens=6)), NOW).reason == ""
    assert BOUNDS.group_completions == 2 and BOUNDS.group_tokens == 2 * BOUNDS.max_completion_tokens


def test_ingest_scores_down_a_peer_whose_pass_rates_disagree_with_ours() -> None:
    refs = [r for r in (tasks.TaskRef(SOURCE.name, SOURCE.config, SOURCE.seed, i) for i in range(40))
            if not SOURCE.is_heldout(tasks.instance(r))][:5]
    book = PassRateBook(PassRateParams(disagree_gap=0.5, disagree_instances=4, min_trials=2))
    for ref in refs:
        book.record(ref, [0.0, 0.0])  # we never solve them
    guard = PeerGuard(Reputation(), None, NodeStats())
    stats = NodeStats()
    ctx = dataclasses.replace(CTX, bounds=dataclasses.replace(BOUNDS, max_context=256))
    ingest = Ingest(ctx, stats, guard=guard, keep_no_signal=True, pass_rates=book)
    for ref in refs:  # the peer always does
        answer = tasks.instance(ref).answer
        ingest([Received("liar", NOW, wire(completion(answer, 1.0), completion(answer, 1.0), sender="liar",
                                           ref=ref))], NOW, lambda ext, sender: [])
    assert stats.errors["pass_rate_disagreement"] == 1  # once, at the 4th shared instance
    assert ingest.peer_drops[("liar", "pass_rate_disagreement")] == 1
    assert guard.reputation.score("liar", NOW) == pytest.approx(5 * 0.05 - 2.0)
    assert book.instances[refs[0]]["liar"] == [2.0, 2.0]  # our re-scored rewards, under the sender's name


def test_a_peer_is_judged_on_its_last_instances_only() -> None:
    book = PassRateBook(PassRateParams(disagree_instances=2, min_trials=1, judged_instances=2, max_judged_peers=1))
    refs = [tasks.TaskRef("chain_sum", "{}", 0, i) for i in range(3)]
    for ref in refs:
        book.record(ref, [0.0])
    book.record(refs[0], [1.0], peer="p")
    book.record(refs[1], [1.0], peer="p")
    assert book.disagreeing("p")
    book.record(refs[2], [0.0], peer="p")  # the last two: gaps 1 and 0, mean 0.5, not over the gap
    assert not book.disagreeing("p")
    book.record(refs[2], [0.0], peer="q")  # one judged peer at most: p is forgotten
    assert list(book._by_peer) == ["q"] and not book.disagreeing("p")
