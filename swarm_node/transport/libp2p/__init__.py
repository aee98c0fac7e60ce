"""The libp2p transport: py-libp2p in a supervised child process (or a trio thread), driven by the node over IPC.
Importing this package loads neither trio nor libp2p; import the module you need.

In the node (asyncio):
- `transport.py`: `LibP2PTransport`, the `Transport` over the host: supervision, restarts, health, peer scores.
- `launch.py`: `LibP2PConfig` and `LAUNCHERS`, starting the host in a child process or on a trio thread.
- `session.py`: the node's end of the IPC socket: calls, frames, and streams with flow control.
- `ipc.py`: the IPC frame format and `HostSettings` (everything the host is told at HELLO).

In the host (trio, py-libp2p):
- `host_process.py`: the child process's entry point (`python -m swarm_node.transport.libp2p.host_process`).
- `host.py`: `NetworkHost` and `run_host`: gossipsub, validation round trips, back-pressure, the node's CALLs.
- `router.py`: `SharingGossipSub`, py-libp2p's GossipSub with flood publishing and gossip to backed-off peers.
- `backpressure.py`: which peers' outbound queues a publish waits for (never a stalled or closed one).
- `stream_bridge.py`: one libp2p stream bridged to S_* frames, with credit-based flow control.
- `guards.py`: guards around py-libp2p's remote crashes, forwarding budgets, record caches.
- `scoring.py`: gossipsub v1.1 peer-score parameters (the node's reputation as the app-specific score).
- NAT traversal (docs/NAT.md): `nat.py` (`NatServices`: UPnP, AutoNAT rounds, relay reservations, DCUtR, status),
  `rendezvous.py` (DHT discovery at the swarm's key), `paths.py` (direct or relayed connections, dialable
  addresses), `dht.py` (our DHT server: budgets, bounded records), `autonat.py` (AutoNAT with a fresh-connection
  dial-back), `relay.py` (circuit relay v2, counted and budgeted), `upnp.py` (UPnP port mapping, the first attempt).
"""
