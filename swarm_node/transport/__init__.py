"""Transports: moving bytes between peers, behind one interface. Importing this package loads neither trio nor
libp2p.

- `base.py`: the `Transport` interface (publish/subscribe with validators, streams, peers) and its value types.
- `memory.py`: the in-memory transport for tests and simulations (a hub with latency, bandwidth and loss).
- `libp2p/`: `LibP2PTransport`, py-libp2p in a supervised child process driven over IPC, and the network host with
  its NAT traversal (docs/NAT.md); its `__init__.py` maps its modules.
- `reachability.py`: reachability verdicts from AutoNAT's answers (sans-I/O); `nat_report.py`: the node's NAT log
  line and /status summary.
- `connectivity.py`: bootstrap keeping (redial with backoff), the local address check, `start_network`
  (no protocol of its own: discovery and reachability are the DHT's and AutoNAT's, above).
- `background.py`: a transport on its own event-loop thread, for a synchronous node loop.
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
