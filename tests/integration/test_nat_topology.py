"""The NAT test bed itself: namespaces are built and always removed, and the NATs behave as their rules say
(a direct dial from outside fails; cone keeps the source port, symmetric does not)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.netns.topology import NAT_RULES, Topology, live_namespaces, namespaces_unavailable

WHY_NOT = namespaces_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces unavailable: {WHY_NOT}")


def _dial(topo: Topology, ns: str, host: str, port: int) -> list[str]:
    out = topo.exec(ns, sys.executable, "-m", "tests.netns.tcp_probe", "dial", host, str(port))
    return out.stdout.split()


def test_nat_blocks_direct_dials_and_maps_ports_as_its_rule_says() -> None:
    with Topology(homes={"a": "cone", "b": "symmetric"}, public=1) as topo:
        home_a, home_b = topo.home("a"), topo.home("b")
        assert (home_a.nat_rule, home_b.nat_rule) == ("masquerade", "masquerade random,fully-random")
        server = topo.popen(topo.pub(0), sys.executable, "-m", "tests.netns.tcp_probe", "listen", "4001", "6",
                            stdout=subprocess.PIPE, text=True)
        inside = topo.popen(home_a.host_ns, sys.executable, "-m", "tests.netns.tcp_probe", "listen", "4001", "6",
                            stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and inside.stdout is not None
        assert server.stdout.readline().strip() == "listening" and inside.stdout.readline().strip() == "listening"
        # Out of each home: works, from the home's private address.
        out_a = _dial(topo, home_a.host_ns, topo.pub_ip(0), 4001)
        out_b = _dial(topo, home_b.host_ns, topo.pub_ip(0), 4001)
        assert out_a[:2] == ["ok", home_a.host_ip] and out_b[:2] == ["ok", home_b.host_ip]
        # Into home A, at its router's public address or its private one, from the internet or from home B: never.
        assert _dial(topo, topo.pub(0), home_a.public_ip, 4001)[0] == "fail"
        assert _dial(topo, home_b.host_ns, home_a.public_ip, 4001)[0] == "fail"
        assert _dial(topo, topo.pub(0), home_a.host_ip, 4001)[0] == "fail"
        server.wait(timeout=20)
        seen = [line.split() for line in server.stdout.read().splitlines()]
        by_ip = {ip: int(port) for _, ip, port in seen}
        assert set(by_ip) == {home_a.public_ip, home_b.public_ip}  # both masqueraded to their router
        assert by_ip[home_a.public_ip] == int(out_a[2])  # cone (plain masquerade) kept the source port
        # fully-random picks a random port: equal to the source port only by a 1-in-~28k chance
        assert by_ip[home_b.public_ip] != int(out_b[2])
        inside.wait(timeout=20)
        assert inside.stdout.read() == ""  # nothing from outside ever reached the home host


def test_namespaces_are_removed_even_when_the_body_fails() -> None:
    topo = Topology(homes={"a": "cone"}, public=1)
    with pytest.raises(RuntimeError, match="boom"):
        with topo:
            assert len(live_namespaces(topo.uid)) == 4  # inet, pub0, router, home host
            topo.popen(topo.home("a").host_ns, "sleep", "60")
            raise RuntimeError("boom")
    assert live_namespaces(topo.uid) == []
    assert all(proc.poll() is not None for proc in topo.procs)


def test_unknown_nat_type_is_refused_and_leaves_nothing() -> None:
    topo = Topology(homes={"a": "restricted"}, public=0)
    with pytest.raises(ValueError, match=re.escape(f"known: {sorted(NAT_RULES)}")):
        with topo:
            pass
    assert live_namespaces(topo.uid) == []
