"""A broken UPnP gateway, run in a router namespace: `python -m tests.netns.fake_igd LAN_IP MODE`.

It answers every SSDP M-SEARCH (multicast 239.255.255.250:1900 on LAN_IP's interface) as an Internet Gateway
Device with a description at http://LAN_IP:PORT/rootDesc.xml, then over HTTP answers every request with random
bytes after a valid status line (MODE "garbage") or accepts and never answers (MODE "stall"). Prints "serving"
when both sockets are up, and one line per request.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading

SSDP_GROUP, SSDP_PORT = "239.255.255.250", 1900


def serve_http(server: socket.socket, mode: str) -> None:
    held: list[socket.socket] = []  # "stall": keep them open, unanswered
    while True:
        conn, peer = server.accept()
        print("http request from", peer[0], flush=True)
        if mode == "stall":
            held.append(conn)
            continue
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: 512\r\n\r\n" + os.urandom(512))
        conn.close()


def main(lan_ip: str, mode: str) -> None:
    http = socket.create_server((lan_ip, 0))
    port = http.getsockname()[1]
    ssdp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    ssdp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ssdp.bind(("", SSDP_PORT))
    ssdp.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                    struct.pack("4s4s", socket.inet_aton(SSDP_GROUP), socket.inet_aton(lan_ip)))
    threading.Thread(target=serve_http, args=(http, mode), daemon=True).start()
    print("serving", flush=True)
    while True:
        data, peer = ssdp.recvfrom(4096)
        if not data.startswith(b"M-SEARCH"):
            continue
        target = next((line.split(b":", 1)[1].strip() for line in data.split(b"\r\n")
                       if line.upper().startswith(b"ST:")), b"upnp:rootdevice")
        print("ssdp search from", peer[0], target.decode(errors="replace"), flush=True)
        reply = (b"HTTP/1.1 200 OK\r\nCACHE-CONTROL: max-age=120\r\nST: " + target + b"\r\nUSN: uuid:fake::" + target
                 + f"\r\nEXT:\r\nSERVER: fake/1 UPnP/1.1 fake/1\r\nLOCATION: http://{lan_ip}:{port}/rootDesc.xml"
                   "\r\n\r\n".encode())
        ssdp.sendto(reply, peer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
