"""A TCP probe to run inside a namespace: `listen PORT SECONDS` accepts for that long and prints each peer's address;
`dial HOST PORT` prints "ok <local ip> <local port>" or "fail <reason>" (timeout 2 s) and exits 0 either way."""

from __future__ import annotations

import socket
import sys
import time


def listen(port: int, seconds: float) -> None:
    with socket.create_server(("0.0.0.0", port), reuse_port=True) as server:
        server.settimeout(0.2)
        print("listening", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            print("accepted", peer[0], peer[1], flush=True)
            conn.close()


def dial(host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=2.0) as conn:
            local = conn.getsockname()
            print("ok", local[0], local[1], flush=True)
    except OSError as exc:
        print("fail", type(exc).__name__, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen(int(sys.argv[2]), float(sys.argv[3]))
    else:
        dial(sys.argv[2], int(sys.argv[3]))
