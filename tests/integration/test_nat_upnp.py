"""UPnP port mapping, a node's first NAT-traversal attempt (transport/libp2p/upnp.py).

Pure decisions first (which external IPs are usable, what an attempt's answers mean, which port to map), then the
mapper's I/O against a fake miniupnpc client, then real gateways in network namespaces: Debian's miniupnpd in a
home router (mapping, refusing, double NAT) and a fake gateway that answers garbage or nothing, and finally libp2p
nodes behind a cone NAT whose router offers UPnP (or not).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.procs import REPO, JsonProc
from swarm_node.config import NetworkConfig, load_config
from swarm_node.errors import ConfigError
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.upnp import BUDGET_S, PortMapper, judge, mappable_port, usable_external_ip
from swarm_node.transport.nat_report import summarise, watch_nat
from tests.netns.topology import Topology, namespaces_unavailable
from tests.netns.upnp import igd_unavailable, mapping_rules, probe_gateways, start_igd

WHY_NOT = namespaces_unavailable() or igd_unavailable()
netns = pytest.mark.skipif(WHY_NOT is not None, reason=f"UPnP test bed unavailable: {WHY_NOT}")
GOING_ON = "continuing with AutoNAT/relays"


# -- pure decisions --------------------------------------------------------------------------------------------
def test_only_a_global_external_ip_is_usable() -> None:
    assert usable_external_ip("11.0.0.101") and usable_external_ip("203.0.114.7")
    assert usable_external_ip("100.128.0.1")  # just past 100.64.0.0/10 (100.64.0.0-100.127.255.255)
    for ip in ("192.168.1.1", "10.1.2.3", "172.16.0.1", "100.64.0.1", "100.100.100.100", "100.127.255.255",
               "127.0.0.1", "0.0.0.0", "169.254.1.1", "", "not an ip", None):
        assert not usable_external_ip(ip), ip


def test_public_external_ip_mapped_is_advertised() -> None:
    outcome = judge(4001, "11.0.0.101", mapped=True)
    assert (outcome.state, outcome.line, outcome.external_addr) == (
        "mapped", "UPnP: mapped TCP port 4001 as 11.0.0.101:4001", "/ip4/11.0.0.101/tcp/4001")


def test_private_or_cgnat_external_ip_is_double_nat_and_advertises_nothing() -> None:
    for ip in ("100.64.3.4", "192.168.0.1"):
        outcome = judge(4001, ip)
        assert (outcome.state, outcome.external_addr) == ("double_nat", "")
        assert outcome.line == (f"UPnP: the gateway's external address {ip} is not public: another NAT is in front "
                                f"of it (double NAT); no port mapped; {GOING_ON}")
    # Even a mapping the gateway took is worthless there: never advertised.
    assert judge(4001, "100.64.3.4", mapped=True).external_addr == ""
    assert judge(4001, "").line == ("UPnP: the gateway reports no public external address (double NAT, or its "
                                    f"internet link is down); no port mapped; {GOING_ON}")


def test_refused_mapping_advertises_nothing_and_no_gateway_says_so() -> None:
    refused = judge(4001, "11.0.0.101", "ConflictInMappingEntry")
    assert (refused.state, refused.external_addr) == ("refused", "")
    assert refused.line == ("UPnP: the gateway at 11.0.0.101 refused to map TCP port 4001 (ConflictInMappingEntry); "
                            f"{GOING_ON}")
    assert judge(4001, None).line == f"UPnP: no gateway answered; {GOING_ON}"
    assert judge(4001, None, "no answer within 6 s").line == (
        f"UPnP: no usable gateway answered (no answer within 6 s); {GOING_ON}")


def test_mappable_port_is_a_wildcard_or_lan_listen_port() -> None:
    assert mappable_port(["/ip4/0.0.0.0/tcp/4001"]) == 4001
    assert mappable_port(["/ip4/127.0.0.1/tcp/5000", "/ip4/192.168.1.2/tcp/4002"]) == 4002
    assert mappable_port(["/ip4/127.0.0.1/tcp/5000"]) is None  # nothing outside could reach it
    assert mappable_port(["/ip4/11.0.0.10/tcp/4001"]) is None  # public already: nothing to traverse
    assert mappable_port(["/ip6/::/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"]) is None


# -- settings --------------------------------------------------------------------------------------------------
def test_upnp_setting_defaults_validates_and_reaches_the_host() -> None:
    assert NetworkConfig().upnp is True  # join: "where the router offers it, as a first attempt"
    assert load_config(overrides={"network.upnp": False}).network.upnp is False
    with pytest.raises(ConfigError, match=r"^network.upnp \(command line\) must be true or false, got 'yes'$"):
        load_config(overrides={"network.upnp": "yes"})
    with pytest.raises(ConfigError, match=r"^network.upnp must be true or false, got 1$"):
        NetworkConfig(upnp=1).validate()  # type: ignore[arg-type]
    assert HostSettings().upnp is False  # tests and benches never touch the router of whoever runs them
    settings = HostSettings(upnp=True)
    assert HostSettings.from_wire(settings.to_wire()) == settings


def test_join_has_the_upnp_flags() -> None:
    from typer.testing import CliRunner

    from cli.main import app

    out = CliRunner().invoke(app, ["join", "--help"], env={"COLUMNS": "200"}).output
    assert "--upnp" in out and "--no-upnp" in out


# -- the summary /status shows, and the one log line -------------------------------------------------------------
def test_summary_carries_the_upnp_outcome_and_the_node_logs_it_once(caplog: pytest.LogCaptureFixture) -> None:
    mapped = judge(4001, "11.0.0.101", mapped=True).status()
    assert "upnp" not in summarise({})  # a host without UPnP support (the in-memory transport has no NAT at all)
    assert summarise({"upnp": mapped})["upnp"] == mapped

    class Host:
        def __init__(self) -> None:
            self.calls = 0
            self.answers = [{"line": "r1", "upnp": {"state": "trying", "line": "UPnP: looking for a gateway"}},
                            {"line": "r1", "upnp": mapped}, {"line": "r2", "upnp": mapped}]

        async def nat_status(self) -> dict[str, Any]:
            self.calls += 1
            return self.answers[min(self.calls, len(self.answers)) - 1]

    async def run() -> None:
        host = Host()
        watcher = asyncio.ensure_future(watch_nat(host, interval_s=0.01))
        deadline = time.monotonic() + 30
        while host.calls < 5 and time.monotonic() < deadline:  # the last answer seen more than once
            await asyncio.sleep(0.01)
        watcher.cancel()

    with caplog.at_level(logging.WARNING, logger="swarm_node.transport.nat_report"):
        asyncio.run(run())
    assert [r.getMessage() for r in caplog.records] == ["r1", "UPnP: mapped TCP port 4001 as 11.0.0.101:4001", "r2"]


# -- the mapper's I/O against a fake miniupnpc client ------------------------------------------------------------
class FakeGateway:
    """miniupnpc.UPnP's surface as PortMapper uses it; `script` says how each call behaves."""

    def __init__(self, external: str = "11.0.0.101", **script: Callable[..., Any]) -> None:
        self.discoverdelay = 0
        self.lanaddr = "192.168.1.2"
        self.external, self.script = external, script
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _do(self, name: str, default: Any, *args: Any) -> Any:
        self.calls.append((name, args))
        return self.script[name](*args) if name in self.script else default

    def discover(self) -> int:
        return int(self._do("discover", 1))

    def selectigd(self) -> str:
        return str(self._do("selectigd", "http://192.168.1.1:5000/ctl/IPConn"))

    def externalipaddress(self) -> str:
        return str(self._do("externalipaddress", self.external))

    def addportmapping(self, *args: Any) -> bool:
        return bool(self._do("addportmapping", True, *args))

    def deleteportmapping(self, *args: Any) -> bool:
        return bool(self._do("deleteportmapping", True, *args))


def _attempt(gateway: FakeGateway, budget_s: float = BUDGET_S, lease_s: int = 3600,
             until: Callable[[], bool] = lambda: True) -> tuple[PortMapper, float]:
    """Run a mapper on port 4001 until it settles and `until()` holds (30 s at most), then cancel it as the host's
    shutdown does. Returns the mapper and how long it took to settle."""
    mapper = PortMapper(gateway=lambda: gateway, budget_s=budget_s, lease_s=lease_s)
    elapsed = 0.0

    async def main() -> None:
        nonlocal elapsed
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mapper.run, 4001)
            start = trio.current_time()
            await mapper.settled.wait()
            elapsed = trio.current_time() - start
            with trio.move_on_after(30):
                while not until():
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return mapper, elapsed


def _raise(text: str) -> Callable[..., Any]:
    def fail(*_: Any) -> Any:
        raise Exception(text)
    return fail


def test_mapper_maps_with_a_lease_and_deletes_the_mapping_when_stopped() -> None:
    gateway = FakeGateway()
    mapper, _ = _attempt(gateway)
    assert mapper.outcome.state == "mapped"  # the outcome it stopped with
    assert gateway.calls == [("discover", ()), ("selectigd", ()), ("externalipaddress", ()),
                             ("addportmapping", (4001, "TCP", "192.168.1.2", 4001, "swarm-node", "", 3600)),
                             ("deleteportmapping", (4001, "TCP"))]
    assert gateway.discoverdelay == 1000


def test_mapper_renews_its_lease_at_half_time_asking_the_external_ip_again() -> None:
    gateway = FakeGateway()
    _attempt(gateway, lease_s=1, until=lambda: [n for n, _ in gateway.calls].count("addportmapping") >= 3)
    names = [name for name, _ in gateway.calls]
    assert names[:7] == ["discover", "selectigd", "externalipaddress", "addportmapping",
                         "externalipaddress", "addportmapping", "externalipaddress"]
    assert names[-1] == "deleteportmapping"


def test_mapper_falls_back_to_a_permanent_lease_where_the_router_takes_only_those() -> None:
    leases: list[int] = []

    def add(*args: Any) -> bool:
        leases.append(args[-1])
        if args[-1]:
            raise Exception("OnlyPermanentLeasesSupported")
        return True

    mapper, _ = _attempt(FakeGateway(addportmapping=add))
    assert leases == [3600, 0] and mapper.outcome.state == "mapped"


def test_mapper_survives_refusal_garbage_and_double_nat() -> None:
    refused, _ = _attempt(FakeGateway(addportmapping=_raise("ConflictInMappingEntry")))
    assert refused.outcome == judge(4001, "11.0.0.101", "ConflictInMappingEntry")
    nothing, _ = _attempt(FakeGateway(discover=_raise("Success")))  # miniupnpc's way of saying "none answered"
    assert nothing.outcome == judge(4001, None)
    garbage, _ = _attempt(FakeGateway(selectigd=_raise("Miniupnpc Invalid Arguments")))
    assert garbage.outcome.state == "no_gateway" and "Miniupnpc Invalid Arguments" in garbage.outcome.line
    cgnat = FakeGateway(external="100.64.0.7")
    double, _ = _attempt(cgnat)
    assert double.outcome == judge(4001, "100.64.0.7")
    assert "addportmapping" not in [name for name, _ in cgnat.calls]  # never asked to map a useless port


def test_a_gateway_that_never_answers_is_given_up_on_within_the_budget() -> None:
    release = threading.Event()
    try:
        mapper, elapsed = _attempt(FakeGateway(discover=lambda: release.wait(60)), budget_s=0.5)
    finally:
        release.set()  # let the abandoned worker thread end
    assert elapsed < 3.0  # 0.5 s budget; slack for a loaded machine
    assert mapper.outcome == judge(4001, None, "no answer within 0.5 s")


# -- real gateways in network namespaces ---------------------------------------------------------------------
@netns
def test_real_and_broken_gateways_give_one_outcome_each_within_the_budget(tmp_path: Path) -> None:
    """One home per gateway: miniupnpd that maps, miniupnpd whose rules refuse our port, miniupnpd whose WAN
    address is carrier-grade NAT space, a fake gateway answering garbage, one that never answers, none at all."""
    out = probe_gateways(tmp_path)
    mapped = out["mapped"]
    assert mapped["line"] == f"UPnP: mapped TCP port 4001 as {mapped['public_ip']}:4001"
    assert mapped["external_addr"] == f"/ip4/{mapped['public_ip']}/tcp/4001"
    assert mapped["rules_while_mapped"] == [f'iif "wan" @nh,72,8 0x6 th dport 4001 dnat ip to {mapped["host_ip"]}:4001']
    assert mapped["rules_after_stop"] == []  # deleted when the mapper stopped
    assert out["refused"]["line"] == (f"UPnP: the gateway at {out['refused']['public_ip']} refused to map TCP port "
                                      f"4001 (Action not authorized); {GOING_ON}")
    assert out["double_nat"]["line"] == judge(4001, "").line  # miniupnpd reports no external address then
    assert out["garbage"]["state"] == "no_gateway" and "not a usable gateway" in out["garbage"]["line"]
    assert out["stall"]["line"] == judge(4001, None, f"no answer within {BUDGET_S:g} s").line
    assert out["none"]["line"] == f"UPnP: no gateway answered; {GOING_ON}"
    for kind, outcome in out.items():
        assert outcome["external_addr"] == "" or kind == "mapped"
        assert outcome["elapsed_s"] < BUDGET_S + 3.0, (kind, outcome)  # bounded, whatever the gateway does
        assert outcome["stopped_after_s"] < 5.0, (kind, outcome)
    print({kind: round(o["elapsed_s"], 2) for kind, o in out.items()})


# -- libp2p nodes behind a router that offers UPnP ---------------------------------------------------------------
async def _node(topo: Topology, ns: str, name: str, *args: str) -> tuple[JsonProc, str]:
    proc = await asyncio.create_subprocess_exec(
        *topo.ns_argv(ns), sys.executable, "-m", "tests.netns.upnp_node", *args, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        start_new_session=True)
    node = JsonProc(proc, name)
    try:
        ready = await node.expect(lambda e: e.get("event") == "ready", 90)
    except BaseException:
        await node.close()
        raise
    return node, str(ready["peer_id"])


async def _wait_nat(node: JsonProc, pred: Callable[[dict[str, Any]], bool], what: str,
                    timeout: float = 120.0) -> dict[str, Any]:
    """Poll the node's NAT status until `pred` holds: a liveness bound, generous for a loaded 2-core machine."""
    deadline = time.monotonic() + timeout
    while True:
        status = (await node.request("nat", cmd="nat"))["status"]
        if pred(status):
            return dict(status)
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.name}: not {what} within {timeout} s; last status {status}")
        await asyncio.sleep(0.5)


def _addr(ip: str, peer_id: str) -> str:
    return f"/ip4/{ip}/tcp/4001/p2p/{peer_id}"


@netns
@pytest.mark.libp2p
async def test_node_behind_a_upnp_router_maps_its_port_is_dialled_directly_and_is_public(tmp_path: Path) -> None:
    """Two public nodes (A's bootstraps and AutoNAT servers), a third public host for a fresh dial, and node A behind
    a cone NAT whose router runs miniupnpd."""
    with Topology(homes={"a": "cone"}, public=3) as topo:
        home = topo.home("a")
        start_igd(topo, "a", tmp_path)
        nodes: dict[str, JsonProc] = {}
        try:
            ids = {}
            for i in (0, 1):
                nodes[f"pub{i}"], ids[f"pub{i}"] = await _node(topo, topo.pub(i), f"pub{i}")
            nodes["a"], ids["a"] = await _node(topo, home.host_ns, "a", "--upnp",
                                               "--bootstrap", _addr(topo.pub_ip(0), ids["pub0"]),
                                               "--bootstrap", _addr(topo.pub_ip(1), ids["pub1"]))
            status = await _wait_nat(nodes["a"], lambda s: s["upnp"]["state"] != "trying", "done with UPnP")
            mapped = f"/ip4/{home.public_ip}/tcp/4001"
            assert status["upnp"] == {"state": "mapped", "external_addr": mapped,
                                      "line": f"UPnP: mapped TCP port 4001 as {home.public_ip}:4001"}
            assert status["advertised"][0] == f"{mapped}/p2p/{ids['a']}"  # first in identify and DHT records
            assert len(mapping_rules(topo, "a")) == 1

            # A fresh public peer, connected to no one, dials A at the mapped address: no relay, no hole punch.
            nodes["prober"], _ = await _node(topo, topo.pub(2), "prober", "--connect-timeout", "5")
            dial = await nodes["prober"].request("connect", cmd="connect", addr=f"{mapped}/p2p/{ids['a']}", timeout=30)
            assert dial["ok"], dial
            prober = await _wait_nat(nodes["prober"], lambda s: ids["a"] in s["paths"], "connected to A")
            assert prober["paths"][ids["a"]] == "direct"
            status = (await nodes["a"].request("nat", cmd="nat"))["status"]
            assert status["reservations"] == [] and status["hole_punch_attempts"] == {}  # neither was needed

            # AutoNAT's fresh dial-backs reach A through the mapping: public, so with relay = auto it serves as a
            # relay and reserves none.
            status = await _wait_nat(nodes["a"], lambda s: s["reachability"] == "public", "public")
            assert status["relay_service"] is True and status["reservations"] == []
            assert status["line"].startswith("reachability: public (2 of 2 AutoNAT servers reached us")
            assert status["hole_punched"] == []

            nodes["a"].send(cmd="quit")
            await asyncio.wait_for(nodes["a"].proc.wait(), 30)
            assert mapping_rules(topo, "a") == []  # the host deleted its mapping on the way out
        finally:
            for node in nodes.values():
                await node.close()


@netns
@pytest.mark.libp2p
async def test_without_upnp_or_without_a_gateway_offering_it_the_node_stays_private(tmp_path: Path) -> None:
    """Home b's router offers UPnP but node B has it off; home c's router offers none and node C tries."""
    with Topology(homes={"b": "cone", "c": "cone"}, public=3) as topo:
        start_igd(topo, "b", tmp_path)
        nodes: dict[str, JsonProc] = {}
        try:
            ids = {}
            for i in (0, 1):
                nodes[f"pub{i}"], ids[f"pub{i}"] = await _node(topo, topo.pub(i), f"pub{i}")
            boot = [arg for i in (0, 1) for arg in ("--bootstrap", _addr(topo.pub_ip(i), ids[f"pub{i}"]))]
            nodes["b"], ids["b"] = await _node(topo, topo.home("b").host_ns, "b", *boot)
            nodes["c"], ids["c"] = await _node(topo, topo.home("c").host_ns, "c", "--upnp", *boot)
            status_b = await _wait_nat(nodes["b"], lambda s: s["reachability"] == "private", "private")
            status_c = await _wait_nat(nodes["c"], lambda s: s["reachability"] == "private", "private")
            assert status_b["upnp"]["state"] == "off" and mapping_rules(topo, "b") == []
            assert status_c["upnp"]["line"] == f"UPnP: no gateway answered; {GOING_ON}"
            for status in (status_b, status_c):
                assert status["relay_service"] is False and status["upnp"]["external_addr"] == ""

            nodes["prober"], _ = await _node(topo, topo.pub(2), "prober", "--connect-timeout", "3")
            for key in ("b", "c"):
                addr = _addr(topo.home(key).public_ip, ids[key])
                dial = await nodes["prober"].request("connect", cmd="connect", addr=addr, timeout=30)
                assert not dial["ok"], (key, dial)  # the NAT drops a direct dial
        finally:
            for node in nodes.values():
                await node.close()
