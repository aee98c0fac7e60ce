"""bench.fanin_real's parts without libp2p: the stand-in's groups, four stand-ins over the in-memory transport
(pulls counted exactly), and the real-against-simulated comparison on hand-made rounds."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from bench.fanin_real import compare, real_figures
from bench.fanin_standin import LIMITS, SOURCE, StandIn, sized_group
from protocol.codec import encode_group
from simulations.scale_model import ScaleSetup
from swarm_node.sharing.exchange import accept_policy_for
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_exchange import FaninExchange
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr


def test_a_stand_in_group_is_the_size_asked_and_carries_signal_only_when_drawn() -> None:
    rng = random.Random(3)
    for signal in (True, False):
        group = sized_group("peer", bytes(16), 2, signal, time.time(), rng, 5120)
        one_token = 8 * 6  # a token id and a float32 log-prob per completion, with their framing
        assert abs(len(encode_group(group)) - 5120) <= one_token
        rewards = {c.claimed_reward for c in group.completions}
        assert len(group.completions) == 8 and (rewards == {0.0, 1.0} if signal else rewards == {0.0})
        assert group.task.index == 2 and group.task.dataset == SOURCE.name


def _has_signal(groups: list) -> bool:  # type: ignore[type-arg]
    return any(len({c.claimed_reward for c in g.completions}) > 1 for g in groups)


def test_four_stand_ins_pull_one_signal_group_from_each_neighbour_with_one() -> None:
    names = [f"n{i}" for i in range(4)]

    async def main() -> dict[str, StandIn]:
        hub = MemoryHub()
        transports = {name: MemoryTransport(hub, name) for name in names}
        setup = ScaleSetup(n=4)
        standins = {}
        for i, name in enumerate(names):
            await transports[name].start()
            exchange = FaninExchange(transports[name], LIMITS, accept_policy_for(SOURCE), FanInParams(),
                                     f"seed{i}".encode(), n_peers=4)
            await exchange.start()
            standins[name] = StandIn(exchange, setup, random.Random(i))
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                await transports[a].connect(memory_addr(b))
        for r in range(3):
            for name in names:  # in turn: each flush sees the other three's latest digests
                await standins[name].step(r)
                await hub.settle()
        return standins

    standins = asyncio.run(main())
    for i, name in enumerate(names):
        rounds = standins[name].rounds
        assert [r["round"] for r in rounds] == [0, 1, 2]
        for r in (0, 1, 2):
            # The others' latest batches at our flush of round r: those after us in turn still at round r-1.
            latest = [standins[other].published[r - 1 if j > i else r] for j, other in enumerate(names)
                      if j < i or (j > i and r > 0)]
            with_signal = sum(_has_signal(groups) for groups in latest)
            assert rounds[r]["pulls_sent"] == rounds[r]["usable"] == rounds[r]["groups"] == with_signal
            assert rounds[r]["drops"] == {} and rounds[r]["pushes_sent"] == 0  # no push before push_after_s
        assert all(len(groups) == 4 for groups in standins[name].published)


def _round(rpcs: int, frames: int, wire_kb: float, usable: int = 4) -> dict[str, float]:
    return {"rpcs": rpcs, "frames": frames, "wire_bytes": wire_kb * 1024, "rpc_bytes": 1024 * rpcs,
            "frame_bytes": 0, "inbound_messages": rpcs, "inbound_bytes": 0, "usable": usable, "pulls_sent": 6,
            "pushes_sent": 1}


def test_real_figures_are_medians_over_nodes_of_means_over_measured_rounds() -> None:
    nodes = [[_round(1000, 0, 999), _round(10, 2, 20), _round(20, 4, 40)],  # the first round is a warm-up one
             [_round(0, 0, 0), _round(30, 0, 60), _round(30, 0, 60)],
             [_round(0, 0, 0), _round(1, 1, 1), _round(3, 1, 3)]]
    real = real_figures(nodes, warmup=1)
    assert real["inbound_msgs_per_round"] == 18.0  # node means 18, 30, 3
    assert real["inbound_kb_per_round"] == 30.0  # node means 30, 60, 2
    assert real["rpcs_per_round"] == 15.0 and real["frames_per_round"] == 1.0
    assert real["rpc_ihave_per_round"] == 0.0  # kinds a round did not count are 0
    out = compare(real, {"inbound_msgs_per_round": 20.0, "inbound_kb_per_round": 24.0})
    assert (out["inbound_msgs_ratio"], out["inbound_kb_ratio"]) == (0.9, 1.25)
    assert out["real"]["usable_per_round"] == 4.0


def test_compare_needs_simulated_traffic() -> None:
    with pytest.raises(ZeroDivisionError):
        compare({"inbound_msgs_per_round": 1.0, "inbound_kb_per_round": 1.0},
                {"inbound_msgs_per_round": 0.0, "inbound_kb_per_round": 1.0})


def test_the_simulators_breakdowns_are_averaged_kind_by_kind_a_missing_kind_counting_zero() -> None:
    from bench.fanin_real import mean_breakdown

    assert mean_breakdown([{"ihave": 14.0, "digest_copy": 62.0}, {"digest_copy": 61.0, "dial": 0.5}]) == {
        "dial": 0.25, "digest_copy": 61.5, "ihave": 7.0}
    assert mean_breakdown([]) == {}


def test_the_router_summary_counts_mesh_sizes_and_heartbeat_intervals_over_the_measured_rounds_only() -> None:
    from bench.fanin_real import router_summary

    def state(mesh: int, beat: float) -> dict[str, object]:
        return {"router": {"digest_mesh": [mesh], "digest_topic_peers": [12], "heartbeat_s": beat}}

    rounds = [[state(9, 1.0), state(2, 1.0), state(3, 60.0)], [state(9, 1.0), state(4, 30.0), {"router": {}}]]
    assert router_summary(rounds, warmup=1) == {"digest_mesh_sizes": {"2": 1, "3": 1, "4": 1},
                                                "digest_mesh_mean": 3.0,
                                                "heartbeat_s": {"1.0": 1, "30.0": 1, "60.0": 1}}
    assert router_summary([[{"round": 0}]], warmup=0) == {"digest_mesh_sizes": {}, "digest_mesh_mean": None,
                                                          "heartbeat_s": {}}
