"""Reaching digest senders (issue 32): address scopes and filtering, what a node announces, and the dial caps."""

from __future__ import annotations

import ipaddress

import pytest

from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.sender_dial import DialBook, announced_addrs, dialable, host_of, own_scopes, scope

PUBLIC = "/ip4/8.8.8.8/tcp/4001"
PUBLIC6 = "/ip6/2606:4700::1/tcp/4001"
PRIVATE = "/ip4/10.0.0.7/tcp/4001"
LOOPBACK = "/ip4/127.0.0.1/tcp/4001"
LINK_LOCAL = "/ip6/fe80::1/tcp/4001"


@pytest.mark.parametrize(("ip", "expected"), [
    ("8.8.8.8", "public"), ("2606:4700::1", "public"), ("10.0.0.1", "private"), ("192.168.1.2", "private"),
    ("fd00::1", "private"), ("127.0.0.1", "loopback"), ("::1", "loopback"), ("169.254.1.1", "link_local"),
    ("fe80::1", "link_local"), ("0.0.0.0", "never"), ("::", "never"), ("224.0.0.1", "never"),
    ("ff02::1", "never"), ("100.64.0.1", "never"), ("240.0.0.1", "never"), ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:8.8.8.8", "public"),
])
def test_scope_of_an_ip(ip: str, expected: str) -> None:
    assert scope(ipaddress.ip_address(ip)) == expected


def test_a_node_announces_the_ip_addresses_of_its_widest_scope_without_its_peer_id() -> None:
    listen = [f"{LOOPBACK}/p2p/QmMe", f"{PRIVATE}/p2p/QmMe", "/ip4/0.0.0.0/tcp/4001/p2p/QmMe", f"{PUBLIC}/p2p/QmMe",
              "/memory/QmMe/p2p/QmMe", "/ip4/8.8.8.8/tcp/4001/p2p/QmMe/p2p-circuit", PUBLIC, LINK_LOCAL, PUBLIC6]
    assert announced_addrs(listen, 4) == (PUBLIC, PUBLIC6)
    assert announced_addrs(listen, 1) == (PUBLIC,)
    assert announced_addrs([LOOPBACK, PRIVATE, LINK_LOCAL, "/ip4/192.168.0.2/tcp/1"], 4) == (
        PRIVATE, "/ip4/192.168.0.2/tcp/1")
    assert announced_addrs([f"{LOOPBACK}/p2p/QmMe", LINK_LOCAL], 4) == (LINK_LOCAL,)
    assert announced_addrs([f"{LOOPBACK}/p2p/QmMe"], 4) == (LOOPBACK,)
    assert announced_addrs(["/memory/QmMe/p2p/QmMe", "/ip4/0.0.0.0/tcp/1"], 4) == ()
    assert own_scopes(listen) == frozenset({"public", "private", "link_local", "loopback"})
    assert own_scopes([f"{LOOPBACK}/p2p/QmMe"]) == frozenset({"loopback"})


def test_learnt_private_and_loopback_addresses_are_dialled_only_by_a_node_on_such_a_network() -> None:
    learnt = (LOOPBACK, PRIVATE, "/ip4/0.0.0.0/tcp/1", PUBLIC, LINK_LOCAL, "/ip4/224.0.0.1/tcp/1", PUBLIC6)
    assert dialable(learnt, frozenset({"public"})) == (PUBLIC, PUBLIC6)
    assert dialable(learnt, frozenset()) == (PUBLIC, PUBLIC6)
    assert dialable(learnt, frozenset({"loopback"})) == (LOOPBACK, PUBLIC, PUBLIC6)
    assert dialable(learnt, frozenset({"private", "link_local"})) == (PRIVATE, PUBLIC, LINK_LOCAL, PUBLIC6)
    assert dialable(("/dns4/example.com/tcp/1", "garbage"), frozenset({"public"})) == ()
    assert host_of(PUBLIC) == "8.8.8.8" and host_of(PUBLIC6) == "2606:4700::1"


def _addr(ip: str, port: int = 4001) -> str:
    return f"/ip4/{ip}/tcp/{port}"


def test_dial_plan_skips_connected_senders_and_caps_dials_per_round() -> None:
    book = DialBook(FanInParams(dials_per_round=2))
    addrs = {s: (_addr(f"8.8.8.{i}"),) for i, s in enumerate("abcde", start=1)}
    own = frozenset({"public"})
    # b is connected; "z" sent no address: neither is dialled. Two dials a round, in the order given.
    assert book.plan(["z", "a", "b", "c", "d"], {"b"}, addrs, own) == {"a": _addr("8.8.8.1"), "c": _addr("8.8.8.3")}
    assert book.plan(["d", "e"], set(), addrs, own) == {}  # the round's two dials are spent
    book.new_round()
    assert book.plan(["d", "e", "a"], set(), addrs, own) == {"d": _addr("8.8.8.4"), "e": _addr("8.8.8.5")}


def test_dial_plan_dials_an_ip_once_a_round_whatever_the_port_and_backs_off_after_a_failure() -> None:
    book = DialBook(FanInParams(dials_per_round=4, dial_backoff_rounds=2))
    own = frozenset({"public"})
    # Three senders name the same victim IP (ports differ): one dial to it this round. d has a second address.
    addrs = {"a": (_addr("9.9.9.9", 1),), "b": (_addr("9.9.9.9", 2),), "c": (_addr("9.9.9.9", 3),),
             "d": (_addr("9.9.9.9", 4), _addr("8.8.4.4"))}
    assert book.plan(["a", "b", "c", "d"], set(), addrs, own) == {"a": _addr("9.9.9.9", 1), "d": _addr("8.8.4.4")}
    book.failed(_addr("9.9.9.9", 1))
    book.new_round()  # round 1: 9.9.9.9 failed in round 0, backed off for 2 rounds
    assert book.plan(["b", "c"], set(), addrs, own) == {}
    book.new_round()  # round 2: still backed off
    assert book.plan(["b"], set(), addrs, own) == {}
    book.new_round()  # round 3: dialled again
    assert book.plan(["c", "b"], set(), addrs, own) == {"c": _addr("9.9.9.9", 3)}


def test_dial_plan_never_dials_a_learnt_loopback_address_unless_we_listen_on_loopback() -> None:
    addrs = {"a": (LOOPBACK,), "b": (PRIVATE, PUBLIC)}
    assert DialBook(FanInParams()).plan(["a", "b"], set(), addrs, frozenset({"public"})) == {"b": PUBLIC}
    assert DialBook(FanInParams()).plan(["a", "b"], set(), addrs, frozenset({"loopback", "private"})) == {
        "a": LOOPBACK, "b": PRIVATE}


@pytest.mark.parametrize("name", ["dials_per_round", "dial_backoff_rounds"])
def test_dial_caps_must_be_positive(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        FanInParams(**{name: 0})
