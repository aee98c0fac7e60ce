"""Transports: moving bytes between peers, behind one interface. Importing this package loads neither trio nor
libp2p.

- `base.py`: the `Transport` interface (publish/subscribe with validators, streams, peers) and its value types.
- `memory.py`: the in-memory transport for tests and simulations (a hub with latency, bandwidth and loss).
- `libp2p_transport.py`: `LibP2PTransport`, py-libp2p in a supervised child process, driven over IPC.
- `libp2p_launch.py`: starting the host process (or thread); `libp2p_session.py`: the IPC session and its streams.
- `libp2p_ipc.py`: the IPC frame format; `libp2p_host.py`: the host itself (trio, runs in the child);
  `libp2p_guards.py`: guards around py-libp2p's remote crashes.
- NAT traversal in the host (docs/NAT.md): `libp2p_upnp.py` (UPnP port mapping, the first attempt),
  `libp2p_nat.py` (DHT rendezvous, relays, DCUtR, status), `libp2p_dht.py` (our DHT server: budgets, bounded records),
  `libp2p_autonat.py` (AutoNAT with a fresh-connection dial-back), `libp2p_relay.py` (circuit relay v2, counted),
  `reachability.py` (verdicts, sans-I/O); in the node, `nat_report.py` (the log line and /status summary).
- `connectivity.py`: bootstrap keeping (redial with backoff), the local address check, `start_network`
  (no protocol of its own: discovery and reachability are the DHT's and AutoNAT's, above).
- `background.py`: a transport on its own event-loop thread, for a synchronous node loop.
- `libp2p_scoring.py`: gossipsub v1.1 peer-score parameters (the node's reputation as the app-specific score).
- `supervisor.py`: restart back-off; `shaping.py`: app-level bandwidth shaping (rate limiters).
"""

from swarm_node.transport.base import (
           Delivery,
           PeerInfo,
           Stream,
           Transport,
           TransportError,
           TransportUnavailable,
           ValidationResult,
)

__all__ = ["Delivery", "PeerInfo", "Stream", "Transport", "TransportError", "TransportUnavailable",
           "ValidationResult"]
