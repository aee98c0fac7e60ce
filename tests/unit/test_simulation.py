"""Simulation harness: scenario errors are one line; sharing lifts a weak node; network model; a tiny full run."""

from __future__ import annotations

import asyncio
import csv
import time
from pathlib import Path

import pytest

from protocol.limits import Limits
from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from simulations.network import LinkModel, NetworkHub
from simulations.report import moving_average, write_report
from simulations.runner import run_cell
from simulations.scenario import NetworkSpec, parse_scenario, with_overrides
from swarm_node import tasks
from swarm_node.errors import UserError
from swarm_node.node.assembly import Sharing, assemble
from swarm_node.node.core import NodeEvents
from swarm_node.sampler.base import SamplingParams
from swarm_node.sharing.exchange import TransportExchange, accept_policy_for
from swarm_node.transport.memory import MemoryTransport, memory_addr

TINY = {"run": {"group_size": 4, "prompts_per_step": 2}, "sampler": {"kind": "hf", "max_new_tokens": 4},
        "train": {"threads": 1, "minibatches": 1}}


@pytest.mark.parametrize(("data", "message"), [
    ({"simulation": {"nodez": 2}}, "unknown key 'nodez' in [simulation]"),
    ({"simulation": {"nodes": 0}}, "simulation.nodes must be in [1, 64], got 0"),
    ({"simulation": {"mode": "fast"}}, "simulation.mode must be one of sync, async, echo, attack, not 'fast'"),
    ({"network": {"loss": 1.5}}, "network.loss must be in [0, 1), got 1.5"),
    ({"network": {"latency_ms": "x"}}, "network.latency_ms must be float, got 'x'"),
    ({"config": {"share": {"correction": {"cap": 3.0}}}}, "share.correction.cap must be <= 1"),
    ({"config": {"share": {"selection": "best"}}}, "share.selection 'best' unknown"),
    ({"config": {"train": {"lr_typo": 1}}}, "unknown key 'train.lr_typo'"),
    ({"node": [{"index": 5}]}, "node[0].index must be in [0, 2), got 5"),
    ({"node": [{"index": 0, "join_round": 3, "leave_round": 2}]}, "need 0 <= join_round < leave_round"),
    ({"variants": [{"name": "a"}, {"name": "a"}]}, "variant names must be distinct"),
    ({"extra": {}}, "unknown key 'extra' in scenario"),
])
def test_bad_scenarios_are_one_line_errors(data: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_scenario(data, "t")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_network_table_builds_the_link_in_the_models_units() -> None:
    spec = parse_scenario({"network": {"latency_ms": 50.0, "uplink_mbps": 10.0, "downlink_mbps": 50, "loss": 0.01}},
                          "t").network
    assert spec == NetworkSpec(latency_ms=50.0, uplink_mbps=10.0, downlink_mbps=50.0, loss=0.01, round_s=10.0)
    assert spec.link() == LinkModel(latency_s=0.05, uplink_bps=10e6, downlink_bps=50e6, loss=0.01)
    assert NetworkSpec().link() == LinkModel()  # the defaults agree: 20 ms, unlimited, no loss


def test_command_line_overrides_replace_only_what_was_given() -> None:
    scn = parse_scenario({"simulation": {"nodes": 3, "rounds": 7, "seeds": [0, 1], "eval_problems": 5}}, "t")
    same = with_overrides(scn, rounds=None, nodes=None, eval_problems=None, seeds=None)
    assert same == scn
    changed = with_overrides(scn, rounds=2, nodes=4, eval_problems=9, seeds=[3])
    assert (changed.rounds, changed.nodes, changed.eval_problems, changed.seeds) == (2, 4, 9, (3,))
    assert changed.network == scn.network and changed.variants == scn.variants


def test_network_model_latency_bandwidth_loss() -> None:
    async def main() -> tuple[list[float], int]:
        hub = NetworkHub(LinkModel(latency_s=0.05, uplink_bps=8000.0, downlink_bps=0.0), seed=1)
        a, b = MemoryTransport(hub, "a"), MemoryTransport(hub, "b")
        arrivals: list[float] = []
        for t in (a, b):
            await t.start()
        await a.connect(memory_addr("b"))
        await b.subscribe("t", lambda d: arrivals.append(hub.now))
        await a.publish("t", b"x" * 100)  # 800 bits at 8000 bit/s = 0.1 s on a's uplink
        await a.publish("t", b"y" * 100)  # queued behind the first on the shared uplink
        await hub.advance_to(0.14)
        early = list(arrivals)
        await hub.advance_to(1.0)
        return early + [-1.0] + arrivals, hub.lost

    got, lost = asyncio.run(main())
    assert got == pytest.approx([-1.0, 0.15, 0.25]) and lost == 0

    async def lossy() -> int:
        hub = NetworkHub(LinkModel(loss=0.5), seed=3)
        a, b = MemoryTransport(hub, "a"), MemoryTransport(hub, "b")
        for t in (a, b):
            await t.start()
        await a.connect(memory_addr("b"))
        seen = []
        await b.subscribe("t", seen.append)
        for _ in range(200):
            await a.publish("t", b"z")
        await hub.advance_to(10.0)
        assert len(seen) + hub.lost == 200
        return len(seen)

    assert 70 < asyncio.run(lossy()) < 130


def test_moving_average() -> None:
    assert moving_average([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]


def _oracle_groups(source: tasks.TaskSource, tok: object, step: int) -> list[RolloutGroup]:
    """A much better policy: for two fixed questions, one exactly right completion and three wrong ones."""
    groups = []
    for index in (0, 1):
        inst = tasks.instance(tasks.TaskRef(source.name, source.config, source.seed, index))
        eos = tok.eos_token_id
        texts = [inst.answer, f"x{step}", f"y{step}", f"z{step}"]  # new content each round: not a duplicate
        comps = [CompletionWire(tuple(tok.encode(t) + [eos]), t, (-1.0,) * (len(tok.encode(t)) + 1),
                                1.0 if t == inst.answer else 0.0) for t in texts]
        groups.append(RolloutGroup(bytes([step, index]) * 8, "oracle", step, TaskRefWire(
            source.name, source.config, source.seed, index), comps, "", "qwen2", time.time()))
    return groups


def _weak_reward_after(tiny_model_dir: Path, tmp_path: Path, external: int, rounds: int = 20) -> float:
    from swarm_node.config import build_config
    cfg = build_config([({**TINY, "train": {"threads": 1, "minibatches": 1, "lr": 1e-2, "warmup_steps": 0},
                          # flood: the oracle floods its groups (TransportExchange) to the weak node
                          "share": {"local_groups": 1, "external_groups": external, "fanin": "flood"},
                          # two-digit sums: the tiny random model almost never answers them by chance
                          "task": {"name": "chain_sum",
                                   "options": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}},
                          "run": {**TINY["run"], "run_dir": str(tmp_path / f"j{external}"), "seed": 0,
                                  "eval_problems": 0},
                          "status": {"port": -1}}, "")])
    hub = NetworkHub(LinkModel(latency_s=0.01))
    weak, oracle = MemoryTransport(hub, "weak"), MemoryTransport(hub, "oracle")
    assembly = assemble(cfg, Sharing.SAPO, transport=weak, events=NodeEvents(log=lambda _m: None),
                        model_dir=tiny_model_dir)
    node = assembly.node
    from swarm_node.model.tokenizer import tokenizer_hash

    async def main() -> None:
        limits = Limits(vocab_size=len(node.tokenizer))
        ex = assembly.exchange
        assert ex is not None
        oracle_ex = TransportExchange(oracle, limits, accept_policy_for(node.task_source))
        for t, e in ((weak, ex), (oracle, oracle_ex)):
            await t.start()
            await e.start()
        await weak.connect(memory_addr("oracle"))
        h = tokenizer_hash(node.tokenizer)
        for rnd in range(rounds):
            draft = assembly.sample_and_share()
            oracle_ex.publish([RolloutGroup(g.group_id, g.policy_id, g.policy_version, g.task, g.completions, h,
                                            g.model_family, g.created_at)
                               for g in _oracle_groups(node.task_source, node.tokenizer, rnd)])
            await ex.flush()
            await oracle_ex.flush()
            await hub.advance_to(float(rnd + 1))
            assembly.mix_and_train(draft)
        await weak.stop()
        await oracle.stop()

    asyncio.run(main())
    # the weak node's own sampled reward on the questions the strong peer shared
    insts = [tasks.instance(tasks.TaskRef(node.task_source.name, node.task_source.config, 0, i)) for i in (0, 1)]
    outs = node.sampler.generate([node.tokenizer.encode(i.prompt) for i in insts], 16,
                                 SamplingParams(1.0, 1.0, 4, seed=123))
    rewards = [tasks.score(i, c.text) for i, group in zip(insts, outs, strict=True) for c in group]
    node.close()
    return sum(rewards) / len(rewards)


def test_sharing_lifts_a_weak_node(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two in-memory nodes, one far better: with sharing the weak node learns the answers it was shown; without,
    its own groups carry no signal (all rewards 0) and its reward stays where it started."""
    alone = _weak_reward_after(tiny_model_dir, tmp_path, external=0)
    shared = _weak_reward_after(tiny_model_dir, tmp_path, external=4)
    assert alone == pytest.approx(1 / 64)  # its starting level: 1 of 64 samples right by chance
    assert shared >= alone + 0.1, (alone, shared)


def test_tiny_scenario_end_to_end(tiny_model_dir: Path, tmp_path: Path) -> None:
    scn = parse_scenario({"simulation": {"nodes": 3, "rounds": 2, "eval_problems": 5, "seeds": [0]},
                          "network": {"latency_ms": 5.0, "round_s": 1.0}, "config": TINY,
                          "variants": [{"name": "2/2", "config": {"share": {"local_groups": 2,
                                                                             "external_groups": 2}}}],
                          "node": [{"index": i, "model": str(tiny_model_dir)} for i in range(3)]}, "tiny")
    result = run_cell(scn, scn.variants[0], 0, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "2-2" / "seed0" / "metrics.csv")))
    assert [(r["node"], r["round"]) for r in rows] == [(str(n), str(r)) for r in (1, 2) for n in range(3)]
    assert all(r["received"] == "4" for r in rows)  # 2 groups from each of the 2 other nodes, every round
    assert len(result["cum_reward_per_node"]) == 3 and len(result["final_eval_acc_per_node"]) == 3
    again = run_cell(scn, scn.variants[0], 0, tmp_path)  # complete cells are reused, not re-run
    assert again == result
    paths = write_report(scn, [result], tmp_path)
    assert all(p.exists() for p in paths)
    assert "| 2/2 | 1 |" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize(("sim", "message"), [
    ({"transport": "tcp"}, "simulation.transport must be one of memory, libp2p, not 'tcp'"),
    ({"transport": "libp2p", "mode": "async"}, "simulation.transport 'libp2p' runs mode 'sync' only"),
    ({"status_port": -1}, "simulation.status_port must be 0 (off) or in [1, 65534] (node i uses port + i), got -1"),
    ({"status_port": 65535}, "simulation.status_port must be 0 (off) or in [1, 65534]"),
    ({"status_port": "8470"}, "simulation.status_port must be int, got '8470'"),
    ({"status_port": 8470, "mode": "echo"}, "simulation.status_port is not available in mode 'echo'"),
])
def test_bad_transport_and_status_port_are_one_line_errors(sim: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_scenario({"simulation": {"nodes": 2, **sim}}, "t")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_simulate_transport_override_is_checked(tmp_path: Path) -> None:
    from cli.simulate_cmd import run_simulate

    path = tmp_path / "a.toml"
    path.write_text('[simulation]\nmode = "async"\n')
    with pytest.raises(UserError, match="^--transport must be one of memory, libp2p, not 'udp'$"):
        run_simulate(path, tmp_path, transport="udp")
    with pytest.raises(UserError, match="runs mode 'sync' only"):
        run_simulate(path, tmp_path, transport="libp2p")


def free_port_pair() -> int:
    """A port P with P and P + 1 free on 127.0.0.1 right now."""
    import socket

    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two consecutive free ports")


def test_status_server_per_simulated_node(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json
    import socket
    import urllib.request

    port = free_port_pair()
    scn = parse_scenario({"simulation": {"nodes": 2, "rounds": 1, "eval_problems": 0, "status_port": port},
                          "network": {"latency_ms": 5.0, "round_s": 1.0}, "config": TINY,
                          "node": [{"index": i, "model": str(tiny_model_dir)} for i in range(2)]}, "st")
    seen = {}

    def on_round(*_args: object) -> None:  # while the cell runs: each node answers on its own port
        for i in (0, 1):
            with urllib.request.urlopen(f"http://127.0.0.1:{port + i}/status", timeout=10) as resp:
                seen[i] = json.load(resp)

    logs: list[str] = []
    run_cell(scn, scn.variants[0], 0, tmp_path, on_round, logs.append)
    assert logs == [f"status node0: http://127.0.0.1:{port}/", f"status node1: http://127.0.0.1:{port + 1}/"]
    assert [(seen[i]["peer_id"], seen[i]["step"], seen[i]["total_steps"]) for i in (0, 1)] == [
        ("node0", 1, 1), ("node1", 1, 1)]
    for i in (0, 1):  # stopped with the cell: nothing listens there any more
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port + i))


def test_round_wait_counts_refused_groups_as_arrived() -> None:
    """The libp2p runner waits until each node has seen the others' groups of the round. A group its validator
    refuses (another task stream) has arrived too: otherwise every such round would wait the full round_s."""
    from simulations.loopback import TrackingExchange, missing_groups
    from swarm_node.model.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    ours, other_seed = tasks.TaskSource(seed=0), tasks.TaskSource(seed=1)

    async def main() -> tuple[list[int], list[int], list[tuple[str, bool, str]]]:
        hub = NetworkHub(LinkModel(latency_s=0.01))
        limits = Limits(vocab_size=len(tok))
        sender = TrackingExchange(MemoryTransport(hub, "oracle"), limits, accept_policy_for(ours))
        same = TrackingExchange(MemoryTransport(hub, "same"), limits, accept_policy_for(ours))
        other = TrackingExchange(MemoryTransport(hub, "other"), limits, accept_policy_for(other_seed))
        exchanges = [sender, same, other]
        for ex in exchanges:
            await ex.transport.start()
            await ex.start()
            ex.begin_round()
        for name in ("same", "other"):
            await sender.transport.connect(memory_addr(name))
        sender.publish(_oracle_groups(ours, tok, 1))
        await sender.flush()
        before = missing_groups(exchanges)
        await hub.advance_to(1.0)
        after = missing_groups(exchanges)
        got = [(r.sender, r.group is not None, r.reason) for ex in (same, other) for r in ex.drain()]
        return before, after, got

    before, after, got = asyncio.run(main())
    assert before == [0, 2, 2] and after == [0, 0, 0]
    assert got == [("oracle", True, ""), ("oracle", True, ""), ("oracle", False, "task_not_allowed")]
