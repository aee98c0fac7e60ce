"""NAT settings: `join --relay` and the network host's NAT knobs validate and travel to the host intact."""

from __future__ import annotations

import pytest

from protocol.chunks import PROTOCOL_ID as CHUNKS_PROTOCOL_ID
from swarm_node.config import NetworkConfig
from swarm_node.errors import ConfigError
from swarm_node.transport.libp2p.ipc import HostSettings


def test_relay_mode_is_validated() -> None:
    for mode in ("auto", "on", "off"):
        NetworkConfig(relay=mode).validate()
    with pytest.raises(ConfigError, match=r"^network.relay 'sometimes' unknown; choose one of auto, on, off$"):
        NetworkConfig(relay="sometimes").validate()
    with pytest.raises(ConfigError, match="relay_circuit_mb must be >= 1"):
        NetworkConfig(relay_circuit_mb=0).validate()


def test_nat_host_settings_round_trip_and_defaults() -> None:
    settings = HostSettings(rendezvous="swarm/rollouts", relay_service="on", relay_circuit_bytes=1 << 20)
    assert HostSettings.from_wire(settings.to_wire()) == settings
    defaults = HostSettings()
    assert (defaults.rendezvous, defaults.relay_service, defaults.autonat_confirmations, defaults.hole_punch) == (
        "", "auto", 3, True)
    assert defaults.no_relay_protocols == (CHUNKS_PROTOCOL_ID,)


def test_start_network_reports_reachability_for_status_over_libp2p() -> None:
    """The node's wiring: a LibP2PTransport with the rendezvous on, start_network's NAT watcher feeding `on_nat`
    (what `join` puts in /status under "network"). On loopback no dial-back proves anything public: unknown."""
    import time

    from swarm_node.identity import generate
    from swarm_node.transport.background import BackgroundTransport
    from swarm_node.transport.libp2p.launch import LibP2PConfig
    from swarm_node.transport.libp2p.transport import LibP2PTransport

    settings = HostSettings(listen=("/ip4/127.0.0.1/tcp/0",), rendezvous="test/rollouts")
    a = BackgroundTransport(lambda: LibP2PTransport(generate(), LibP2PConfig(host=settings)))
    b = BackgroundTransport(lambda: LibP2PTransport(generate(), LibP2PConfig(host=settings)))
    a.start()
    b.start()
    summaries: list[dict[str, object]] = []
    try:
        a.start_network([])
        b.start_network([a.listen_addrs()[0]], on_nat=summaries.append, check_interval_s=0.2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (summaries and summaries[-1]["peers_direct"] == 1):
            time.sleep(0.2)
        last = summaries[-1]
        assert (last["reachability"], last["peers_direct"], last["peers_relayed"], last["relay_reservations"]) == (
            "unknown", 1, 0, [])
        assert str(last["line"]).startswith("reachability: unknown so far")
        assert last["relay_service"] is False  # auto: only once public
    finally:
        a.stop()
        b.stop()
