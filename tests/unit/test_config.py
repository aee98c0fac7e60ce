"""Config precedence (defaults < TOML < flags) and one-line errors for typos and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_node.config import load_config
from swarm_node.errors import ConfigError


def test_precedence(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[run]\nsteps = 50\nseed = 3\n[train]\nlr = 1e-3\n[task]\nname = "basic_arithmetic"\n'
                 '[task.options]\nmin_terms = 2\n')
    cfg = load_config(f, {"run.steps": 7, "run.seed": None})
    assert (cfg.run.steps, cfg.run.seed, cfg.train.lr, cfg.run.group_size) == (7, 3, 1e-3, 8)
    assert cfg.task.name == "basic_arithmetic" and cfg.task.options == {"min_terms": 2}


@pytest.mark.parametrize(("text", "message"), [
    ("[run]\nstepz = 5\n", "unknown key 'run.stepz' in c.toml"),
    ("[trian]\nlr = 1\n", "unknown key 'trian' in c.toml"),
    ("[run]\nsteps = \"many\"\n", "run.steps in c.toml must be int"),
    ("[run]\nsteps = 0\n", "run.steps must be > 0"),
    ("[sampler]\nkind = \"gpu\"\n", "sampler.kind 'gpu' unknown; choose one of auto, vllm, hf"),
    ("[train]\nlr = nan\n", "train.lr in c.toml must be finite"),
    ("[train]\nadvantage = \"magic\"\n", "train.advantage 'magic' unknown"),
    ("[run]\nresume = 1\n", "run.resume in c.toml must be true or false"),
    ("[run\n", "is not valid TOML"),
])
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_int_accepted_for_float() -> None:
    assert load_config(None, {"train.lr": 1}).train.lr == 1.0


def test_echo_publish_interval_must_fit_the_staleness_bound() -> None:
    from swarm_node.config import load_config
    from swarm_node.errors import ConfigError

    load_config(None, {"network.role": "learner", "echo.publish_every": 2, "train.max_staleness": 1})
    with pytest.raises(ConfigError, match="publish_every"):
        load_config(None, {"network.role": "learner", "echo.publish_every": 2, "train.max_staleness": 0})


def test_peers_table(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[peers]\nrescore_share = 0.5\nallow = ["12D3KooWFriend"]\ndeny = ["12D3KooWFoe"]\n'
                    'weights = { duplicate = -1 }\n')
    cfg = load_config(path)
    assert (cfg.peers.rescore_share, cfg.peers.allow, cfg.peers.deny) == (0.5, ["12D3KooWFriend"], ["12D3KooWFoe"])
    assert cfg.peers.weights == {"duplicate": -1} and cfg.peers.ban_s == 3600.0


@pytest.mark.parametrize(("section", "message"), [
    ('rescore_share = 0', "peers.rescore_share must be > 0"),
    ('graylist_score = -60', "ban_score <= graylist_score < 0"),
    ('allow = ["a b"]', "is not a peer id"),
    ('allow = ["X"]\ndeny = ["X"]', "both peers.allow and peers.deny"),
    ('weights = { stale = "a lot" }', "peers.weights.stale must be a finite number"),
    ('unknown = 1', "unknown key 'peers.unknown'"),
])
def test_bad_peers_table_is_one_line(tmp_path: Path, section: str, message: str) -> None:
    path = tmp_path / "node.toml"
    path.write_text(f"[peers]\n{section}\n")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as err:
        load_config(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("listen", ["/ip4/0.0.0.0/udp/4001/quic-v1", "/ip4/0.0.0.0/udp/4001/quic-v1/tcp/1"])
def test_a_quic_listen_address_is_a_one_line_error(tmp_path: Path, listen: str) -> None:
    """py-libp2p 0.8.1's QUIC is not used (docs/NAT.md): the host would silently listen on nothing."""
    path = tmp_path / "node.toml"
    path.write_text(f'[network]\nlisten = "{listen}"\n')
    with pytest.raises(ConfigError, match="listens on TCP only") as err:
        load_config(path)
    assert "\n" not in str(err.value)
