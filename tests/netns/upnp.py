"""UPnP gateways for a Topology's home routers: the real miniupnpd (Debian's miniupnpd 2.3.1, nftables backend), or a
fake one that answers garbage or nothing.

Contract: `igd_unavailable()` says exactly why miniupnpd cannot run here (None when it can). `start_igd(topo, key,
workdir, mode)` runs miniupnpd in home `key`'s router (started with `topo.popen`, so teardown kills it) and returns
once it serves SSDP and HTTP:
  - ext_ifname = the router's internet side (`wan`), listening_ip = its home LAN side (`lan`), secure_mode (a LAN
    host may map ports only to itself), allow rules for the home LAN on ports 1024-65535, everything else denied;
  - mode "refuse": allow rules for ports 1024-2000 only, so a mapping of our listen port (4001) is refused;
  - mode "double_nat": ext_ifname is a second router interface at 100.64.<n>.1 (carrier-grade NAT space), as on
    a router whose WAN address is behind the ISP's NAT; miniupnpd then reports no usable external address.
  The router gets the chains miniupnpd's nftables backend writes to (table inet upnp: its DNAT and filter rules),
  and its forward filter accepts connections that a DNAT rule redirected (`ct status dnat accept`), as a home
  router that honours port forwards does. `mapping_rules` lists miniupnpd's DNAT rules (empty once unmapped).
`start_fake_igd(topo, key, mode)` runs tests/netns/fake_igd.py there instead: "garbage" or "stall".
`probe_gateways(workdir)` builds one home per kind of gateway (GATEWAYS: miniupnpd that maps, one that refuses,
one behind carrier-grade NAT, the garbage and the silent fake, none at all), runs the node's UPnP attempt alone
(tests/netns/upnp_probe.py) in every home at once, then stops them all; per kind: the outcome, how long it took,
miniupnpd's DNAT rules while mapped and after the stop, and how long the stop took.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.netns.topology import Topology

MINIUPNPD = "/usr/sbin/miniupnpd"
REPO = Path(__file__).resolve().parents[2]
GATEWAYS = {"mapped": "normal", "refused": "refuse", "double_nat": "double_nat", "garbage": "garbage",
            "stall": "stall", "none": ""}
UPNP_TABLE = """table inet upnp {
 chain forward { type filter hook forward priority filter - 1; policy accept; jump miniupnpd; }
 chain miniupnpd { }
 chain prerouting { type nat hook prerouting priority dstnat; policy accept; jump prerouting_miniupnpd; }
 chain postrouting { type nat hook postrouting priority srcnat - 1; policy accept; jump postrouting_miniupnpd; }
 chain prerouting_miniupnpd { }
 chain postrouting_miniupnpd { }
}
"""


def igd_unavailable() -> str | None:
    if not Path(MINIUPNPD).exists():
        return f"`{MINIUPNPD}` is not installed (scripts/install.sh --test installs Debian's miniupnpd)"
    return None


def _checked(out: subprocess.CompletedProcess[str]) -> None:
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, out.args))} failed ({out.returncode}): {out.stderr.strip()}")


def _config(topo: Topology, key: str, mode: str) -> str:
    home = topo.home(key)
    lan = f"192.168.{home.index}.0/24"
    ports = "1024-2000" if mode == "refuse" else "1024-65535"
    return (f"ext_ifname={'cgn' if mode == 'double_nat' else 'wan'}\n"
            "listening_ip=lan\n"
            "enable_upnp=yes\nenable_natpmp=no\nsecure_mode=yes\nsystem_uptime=yes\n"
            "upnp_table_name=upnp\nupnp_nat_table_name=upnp\n"
            f"uuid={uuid.uuid4()}\n"
            f"allow {ports} {lan} {ports}\n"
            "deny 0-65535 0.0.0.0/0 0-65535\n")


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}): {path.read_text(errors='replace')[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready in {timeout} s: {path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)


def start_igd(topo: Topology, key: str, workdir: Path, mode: str = "normal") -> Path:
    """miniupnpd in home `key`'s router; returns its log (debug mode: every request it answers)."""
    if mode not in ("normal", "refuse", "double_nat"):
        raise ValueError(f"unknown IGD mode {mode!r}")
    home = topo.home(key)
    router = home.router_ns
    subprocess.run(["ip", "netns", "exec", router, "nft", "-f", "-"], input=UPNP_TABLE, text=True, check=True,
                   capture_output=True, timeout=30)
    _checked(topo.exec(router, "nft", "insert", "rule", "ip", "filter", "forward", "ct", "status", "dnat", "accept"))
    if mode == "double_nat":
        _checked(topo.exec(router, "ip", "link", "add", "cgn", "type", "veth", "peer", "name", "cgn-peer"))
        _checked(topo.exec(router, "ip", "addr", "add", f"100.64.{home.index}.1/24", "dev", "cgn"))
        for dev in ("cgn", "cgn-peer"):
            _checked(topo.exec(router, "ip", "link", "set", dev, "up"))
    config = workdir / f"miniupnpd-{key}.conf"
    config.write_text(_config(topo, key, mode))
    log = workdir / f"miniupnpd-{key}.log"
    with log.open("wb") as out:
        proc = topo.popen(router, MINIUPNPD, "-d", "-f", str(config), "-P", str(workdir / f"miniupnpd-{key}.pid"),
                          stdout=out, stderr=subprocess.STDOUT)
    _wait_for(log, "HTTP listening on port", proc, f"miniupnpd in {router}")
    return log


def start_fake_igd(topo: Topology, key: str, workdir: Path, mode: str) -> Path:
    """tests/netns/fake_igd.py in home `key`'s router: it answers SSDP, then garbage ("garbage") or nothing
    ("stall") over HTTP."""
    home = topo.home(key)
    log = workdir / f"fake-igd-{key}.log"
    with log.open("wb") as out:
        proc = topo.popen(home.router_ns, sys.executable, "-m", "tests.netns.fake_igd", f"192.168.{home.index}.1",
                          mode, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    _wait_for(log, "serving", proc, f"fake IGD in {home.router_ns}")
    return log


def mapping_rules(topo: Topology, key: str) -> list[str]:
    """miniupnpd's DNAT rules in home `key`'s router, one per mapped port."""
    out = topo.exec(topo.home(key).router_ns, "nft", "list", "chain", "inet", "upnp", "prerouting_miniupnpd")
    return [line.strip() for line in out.stdout.splitlines() if "dnat" in line]


def probe_gateways(workdir: Path) -> dict[str, dict[str, Any]]:
    with Topology(homes={kind: "cone" for kind in GATEWAYS}, public=1) as topo:
        for kind, mode in GATEWAYS.items():
            if mode in ("garbage", "stall"):
                start_fake_igd(topo, kind, workdir, mode)
            elif mode:
                start_igd(topo, kind, workdir, mode)
        probes = {kind: topo.popen(topo.home(kind).host_ns, sys.executable, "-m", "tests.netns.upnp_probe", "4001",
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
                  for kind in GATEWAYS}
        out = {kind: _json_line(probe) for kind, probe in probes.items()}
        out["mapped"]["rules_while_mapped"] = mapping_rules(topo, "mapped")
        for probe in probes.values():
            assert probe.stdin is not None
            probe.stdin.write("stop\n")
            probe.stdin.flush()
        for kind, probe in probes.items():
            out[kind].update(_json_line(probe))
        out["mapped"]["rules_after_stop"] = mapping_rules(topo, "mapped")
        for kind in GATEWAYS:
            out[kind]["public_ip"], out[kind]["host_ip"] = topo.home(kind).public_ip, topo.home(kind).host_ip
    return out


def _json_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"upnp_probe exited ({proc.wait()}) without an answer")
    return dict(json.loads(line))
