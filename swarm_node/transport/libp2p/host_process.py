"""The network host's child process: `python -m swarm_node.transport.libp2p.host_process --ipc-fd N`.

Contract: serves one node over the inherited socket `N` (`host.run_host`) and exits when the node closes it; what
`launch.py` starts for isolation "process", so that a remote crash in py-libp2p ends only this process. Logs go to
stderr; py-libp2p's ordinary outcomes logged at ERROR are silenced (the node reports them as TransportError);
SIGINT is ignored (the node decides when we stop); SIGUSR1 dumps every thread's stack.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import socket
import sys

import trio

from swarm_node.transport.libp2p.host import run_host


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the libp2p network host, in a child process of the node (launch.py)")
    parser.add_argument("--ipc-fd", type=int, required=True, help="inherited socket connected to the node")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s libp2p-host %(levelname)s %(name)s: %(message)s")
    # py-libp2p logs ordinary outcomes at ERROR (a peer that does not speak a protocol, a dial that fails, with
    # multi-line dumps); the node gets them as TransportError and reports them at its own level.
    for name in ("libp2p.host.basic_host", "libp2p.transport.tcp.tcp", "libp2p.kad_dht", "libp2p.network.swarm",
                 "libp2p.relay.circuit_v2.protocol", "libp2p.relay.circuit_v2.transport", "libp2p.host.autonat"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # Ctrl-C reaches the whole process group; the node decides when we stop (it closes the socket).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # as the node: `kill -USR1` dumps our stacks
    trio.run(run_host, socket.socket(fileno=args.ipc_fd))


if __name__ == "__main__":
    main()
