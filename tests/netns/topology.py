"""Real NATs on one machine: Linux network namespaces, veth pairs, a bridge as "the internet", a router per home.

Contract: `Topology(homes={"a": "cone", "b": "symmetric"}, public=3)` is a context manager. On enter it builds, with
`ip` and `nft` (root, or a user namespace with CAP_NET_ADMIN):
  - `<uid>-inet`: a bridge `br0` as the internet, 11.0.0.0/24 (a global range: Python and libp2p class it public;
    no packet leaves the namespaces we create);
  - `<uid>-pub<i>` for i < public: a public host at 11.0.0.(10+i) on the bridge;
  - per home `k` (n = 1, 2, ...): a router `<uid>-rt<k>` (WAN 11.0.0.(100+n) on the bridge, LAN 192.168.n.1/24,
    forwarding on, nft `masquerade` for "cone" or `masquerade random,fully-random` for "symmetric", and filters
    that silently drop new connections from the WAN, as home routers do, rather than answer with a reset) and
    the home host `<uid>-h<k>` at 192.168.n.2 behind it.
On exit (always, also when the body raised) it kills the processes it started and every process left in its
namespaces (all of them ours: the names carry a fresh random uid), then deletes the namespaces. `Topology.exec`
runs a command in a namespace; `popen` starts one there (tracked for teardown). `namespaces_unavailable()` says
exactly why namespaces cannot be built here (None when they can).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

NAT_RULES = {
    "cone": "masquerade",
    "symmetric": "masquerade random,fully-random",
}
INTERNET = "11.0.0"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def namespaces_unavailable() -> str | None:
    """None if this machine can build the topology, else the exact reason it cannot."""
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/install.sh --test installs iproute2 and nftables)"
    name = f"snprobe-{secrets.token_hex(4)}"
    out = _run("ip", "netns", "add", name, check=False)
    if out.returncode != 0:
        return f"cannot create a network namespace (`ip netns add` said: {out.stderr.strip()})"
    try:
        probe = _run("ip", "netns", "exec", name, "nft", "add", "table", "ip", "probe", check=False)
        if probe.returncode != 0:
            return f"nftables does not work in a network namespace (`nft` said: {probe.stderr.strip()})"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


@dataclass
class Home:
    key: str
    nat: str
    index: int
    router_ns: str
    host_ns: str

    @property
    def host_ip(self) -> str:
        return f"192.168.{self.index}.2"

    @property
    def public_ip(self) -> str:
        return f"{INTERNET}.{100 + self.index}"

    @property
    def nat_rule(self) -> str:
        return NAT_RULES[self.nat]


@dataclass
class Topology:
    homes: dict[str, str] = field(default_factory=dict)
    public: int = 1
    uid: str = field(default_factory=lambda: f"sn{secrets.token_hex(3)}")
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)
    created: list[str] = field(default_factory=list)

    # -- names ------------------------------------------------------------------------------------------------
    @property
    def inet(self) -> str:
        return f"{self.uid}-inet"

    def pub(self, i: int) -> str:
        return f"{self.uid}-pub{i}"

    @staticmethod
    def pub_ip(i: int) -> str:
        return f"{INTERNET}.{10 + i}"

    def home(self, key: str) -> Home:
        index = list(self.homes).index(key) + 1
        return Home(key, self.homes[key], index, f"{self.uid}-rt{key}", f"{self.uid}-h{key}")

    # -- building ---------------------------------------------------------------------------------------------
    def _netns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _wire(self, ns: str, port: str, inner: str, addr: str) -> None:
        """A veth from the bridge (port `port` in inet) to `inner` in `ns`, with `addr`."""
        _run("ip", "-n", self.inet, "link", "add", port, "type", "veth", "peer", "name", inner, "netns", ns)
        _run("ip", "-n", self.inet, "link", "set", port, "master", "br0", "up")
        _run("ip", "-n", ns, "addr", "add", addr, "dev", inner)
        _run("ip", "-n", ns, "link", "set", inner, "up")

    def build(self) -> None:
        for nat in self.homes.values():
            if nat not in NAT_RULES:
                raise ValueError(f"unknown NAT type {nat!r}; known: {sorted(NAT_RULES)}")
        self._netns(self.inet)
        _run("ip", "-n", self.inet, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.inet, "link", "set", "br0", "up")
        for i in range(self.public):
            self._netns(self.pub(i))
            self._wire(self.pub(i), f"p{i}", "eth0", f"{self.pub_ip(i)}/24")
        for key in self.homes:
            home = self.home(key)
            self._netns(home.router_ns)
            self._netns(home.host_ns)
            self._wire(home.router_ns, f"r{home.index}", "wan", f"{home.public_ip}/24")
            _run("ip", "-n", home.router_ns, "link", "add", "lan", "type", "veth", "peer", "name", "eth0",
                 "netns", home.host_ns)
            _run("ip", "-n", home.router_ns, "addr", "add", f"192.168.{home.index}.1/24", "dev", "lan")
            _run("ip", "-n", home.router_ns, "link", "set", "lan", "up")
            _run("ip", "-n", home.host_ns, "addr", "add", f"{home.host_ip}/24", "dev", "eth0")
            _run("ip", "-n", home.host_ns, "link", "set", "eth0", "up")
            _run("ip", "-n", home.host_ns, "route", "add", "default", "via", f"192.168.{home.index}.1")
            _run("ip", "netns", "exec", home.router_ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
            ruleset = (
                "table ip nat {\n"
                " chain postrouting { type nat hook postrouting priority srcnat; policy accept;\n"
                f"  oifname \"wan\" {home.nat_rule}\n }}\n"
                "}\n"
                "table ip filter {\n"
                " chain forward { type filter hook forward priority filter; policy drop;\n"
                "  ct state established,related accept\n"
                "  iifname \"lan\" oifname \"wan\" accept\n }\n"
                " chain input { type filter hook input priority filter; policy accept;\n"
                "  iifname \"wan\" ct state new drop\n }\n"
                "}\n"
            )
            subprocess.run(["ip", "netns", "exec", home.router_ns, "nft", "-f", "-"], input=ruleset, text=True,
                           check=True, capture_output=True, timeout=30)

    # -- running things ---------------------------------------------------------------------------------------
    def exec(self, ns: str, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout)

    def popen(self, ns: str, *argv: str, **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def ns_argv(self, ns: str) -> list[str]:
        """The argv prefix that runs a command in `ns` (for asyncio subprocesses the caller tracks itself)."""
        return ["ip", "netns", "exec", ns]

    # -- teardown ---------------------------------------------------------------------------------------------
    def teardown(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        for name in reversed(self.created):
            # A process left in one of our namespaces keeps it alive after `ip netns del`: end them first.
            pids = _run("ip", "netns", "pids", name, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", name, check=False)
        self.created.clear()

    def __enter__(self) -> Topology:
        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.teardown()


def live_namespaces(uid: str) -> list[str]:
    """The namespaces whose names start with `uid` (teardown must leave none)."""
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(uid)]
