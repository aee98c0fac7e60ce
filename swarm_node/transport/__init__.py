"""Transports: the interface (`base`), an in-memory implementation (`memory`) and py-libp2p (`libp2p_transport`,
whose network host runs in `libp2p_host`). Importing this package loads neither trio nor libp2p."""

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
