"""The issue's integration test: real OS processes on 127.0.0.1 exchanging realistic RolloutGroups.

Three nodes join through one bootstrap (node 1; the DHT rendezvous then connects 2 and 3 directly), each publishes
rollout groups and receives all of the others'; the bootstrap is killed with SIGKILL and the other two keep
exchanging; a fourth process (a raw py-libp2p peer) sends
malformed, oversized, unsigned, wrongly-attributed and replayed messages, including a replay after gossipsub's
seen-cache has expired (the nodes run with a 2 s seen TTL so that happens within the test), plus the two frames
that crash an unguarded py-libp2p 0.8.1. Nobody crashes, nothing forged or replayed is accepted.
"""

from __future__ import annotations

import asyncio

import pytest

from bench.procs import JsonProc
from tests.libp2p_helpers.rollouts import TOPIC, rollout_batch

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(150)]

SEEN_TTL = ["--seen-ttl", "2", "--sweep", "1"]


async def publish(node: JsonProc, count: int) -> list[str]:
    return (await node.request("published", cmd="publish", count=count))["group_ids"]


async def stats(node: JsonProc) -> dict:  # type: ignore[type-arg]
    return await node.request("stats", cmd="stats")


async def wait_delivered(node: JsonProc, expected: dict[str, list[str]], timeout: float = 20.0) -> dict:  # type: ignore[type-arg]
    """Poll until `node` has delivered exactly the expected groups per signer (as sets); returns its stats."""
    async def poll() -> dict:  # type: ignore[type-arg]
        while True:
            got = await stats(node)
            if {s: sorted(g) for s, g in got["delivered"].items()} == {s: sorted(g) for s, g in expected.items()}:
                return got
            await asyncio.sleep(0.2)
    try:
        return await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        got = await stats(node)
        raise AssertionError(f"{node.name} delivered {got['delivered']}, expected {expected}") from None


async def test_three_nodes_kill_one_and_an_adversary() -> None:
    procs: list[JsonProc] = []
    try:
        boot = await JsonProc.start("tests.libp2p_helpers.node", *SEEN_TTL, name="node1")
        procs.append(boot)
        boot_ready = await boot.expect(lambda e: e.get("event") == "ready", 60)
        n2 = await JsonProc.start("tests.libp2p_helpers.node", "--bootstrap", boot_ready["addr"], *SEEN_TTL,
                                  name="node2")
        n3 = await JsonProc.start("tests.libp2p_helpers.node", "--bootstrap", boot_ready["addr"], *SEEN_TTL,
                                  name="node3")
        attacker = await JsonProc.start("tests.libp2p_helpers.attacker", name="attacker")
        procs += [n2, n3, attacker]
        ids = {"boot": boot_ready["peer_id"]}
        n2_ready = await n2.expect(lambda e: e.get("event") == "ready", 60)
        ids["n2"] = n2_ready["peer_id"]
        ids["n3"] = (await n3.expect(lambda e: e.get("event") == "ready", 60))["peer_id"]
        await attacker.expect(lambda e: e.get("event") == "ready", 60)
        # Nodes 2 and 3 only know the bootstrap; the DHT rendezvous through it connects them to each other too.
        for node in (boot, n2, n3):
            await node.request("subscribed", cmd="wait_subscribed", n=2, timeout=30)

        # Round 1: everyone publishes; everyone receives all of the others' groups.
        sent = {"boot": await publish(boot, 4), "n2": await publish(n2, 4), "n3": await publish(n3, 4)}
        for me, node in (("boot", boot), ("n2", n2), ("n3", n3)):
            await wait_delivered(node, {ids[k]: v for k, v in sent.items() if k != me})

        # SIGKILL the bootstrap node (with its network host); 2 and 3 keep exchanging.
        boot.kill_group()
        round2 = {"n2": await publish(n2, 4), "n3": await publish(n3, 4)}
        await wait_delivered(n2, {ids["boot"]: sent["boot"], ids["n3"]: sent["n3"] + round2["n3"]})
        await wait_delivered(n3, {ids["boot"]: sent["boot"], ids["n2"]: sent["n2"] + round2["n2"]})

        # The adversary joins through node 2 and records honest messages (with their signatures).
        await attacker.request("connected", cmd="connect", addr=n2_ready["addr"])
        await attacker.request("capturing", cmd="capture", topic=TOPIC)
        await n2.request("subscribed", cmd="wait_subscribed", n=2)
        round3 = await publish(n3, 1)
        for _ in range(100):
            if ids["n3"] in (await attacker.request("captured", cmd="captured"))["signers"]:
                break
            await asyncio.sleep(0.1)
        n3_groups = sent["n3"] + round2["n3"] + round3
        await wait_delivered(n2, {ids["boot"]: sent["boot"], ids["n3"]: n3_groups})
        before = await stats(n2)

        # Replays of node 3's group, byte-identical: at once (gossipsub's seen-cache drops it, unless its 2 s TTL
        # ran out while the test waited above: then our guard does), then after the seen-cache has surely forgotten
        # it (2 s TTL + 1 s sweep): only our replay guard stands in the way (IGNORE, exactly one more).
        await attacker.request("sent", cmd="replay", target=ids["n2"], signer=ids["n3"])
        await asyncio.sleep(4.0)
        first = (await stats(n2))["verdicts"]["IGNORE"]
        assert first - before["verdicts"]["IGNORE"] in (0, 1)
        await attacker.request("sent", cmd="replay", target=ids["n2"], signer=ids["n3"])
        for _ in range(100):
            if (await stats(n2))["verdicts"]["IGNORE"] != first:
                break
            await asyncio.sleep(0.1)
        assert (await stats(n2))["verdicts"]["IGNORE"] == first + 1

        # Validly signed by the attacker but malformed, oversized, or attributed to node 3's policy: REJECT.
        _, forged = rollout_batch(ids["n3"], 99)  # claims node 3's policy, signed by the attacker
        for payload in (b"\x93junk", b"\xc6" + b"\x00" * (600 << 10), forged):
            await attacker.request("sent", cmd="publish", topic=TOPIC, data_hex=payload.hex())
        # Unsigned, forged signature (from = node 3), and the frames that crash an unguarded py-libp2p.
        for kind in ("unsigned", "forged_signature", "oversized_frame", "malformed_key", "undecodable_frame"):
            await attacker.request("sent", cmd="raw", target=ids["n2"], kind=kind, topic=TOPIC, honest=ids["n3"])

        # Nobody crashed: 2 and 3 still exchange, and delivered exactly the honest groups, each once.
        round4 = {"n2": await publish(n2, 2), "n3": await publish(n3, 2)}
        final_n2 = await wait_delivered(n2, {ids["boot"]: sent["boot"], ids["n3"]: n3_groups + round4["n3"]})
        final_n3 = await wait_delivered(n3, {ids["boot"]: sent["boot"],
                                             ids["n2"]: sent["n2"] + round2["n2"] + round4["n2"]})
        for final in (final_n2, final_n3):
            assert final["restarts"] == 0
            for signer, groups in final["delivered"].items():
                assert len(groups) == len(set(groups)), f"a group from {signer} was delivered twice"
        assert final_n2["verdicts"]["REJECT"] == before["verdicts"]["REJECT"] + 3
        assert final_n2["host_counters"]["undecodable_frame"] == 1
        assert final_n2["host_counters"]["malformed_key"] == 1
    finally:
        for proc in procs:
            await proc.close()
