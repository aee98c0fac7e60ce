"""Config precedence (defaults < TOML < flags) and one-line errors for typos and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_node.config import load_config
from swarm_node.errors import ConfigError


def config_error(tmp_path: Path, text: str) -> str:
    """The one-line ConfigError that loading `text` as c.toml raises."""
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    return str(info.value)

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
    ("[sampler]\nkind = \"gpu\"\n", "sampler.kind 'gpu' unknown; choose one of auto, vllm, native, hf"),
    ("[train]\nlr = nan\n", "train.lr in c.toml must be finite"),
    ("[train]\nadvantage = \"magic\"\n", "train.advantage 'magic' unknown"),
    ("[run]\nresume = 1\n", "run.resume in c.toml must be true or false"),
    ("[run\n", "is not valid TOML"),
])
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    error = config_error(tmp_path, text)
    assert message in error
    assert "\n" not in error


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


# ---- variants by kind, renamed keys, a config that holds still ----

@pytest.mark.parametrize(("text", "new_key"), [
    ('[share]\nexternal_correction = "ftis"\n', "[share.correction] kind"),
    ("[share]\nis_cap = 0.5\n", "[share.correction] cap"),
    ("[share]\nis_band_low = 0.2\n", "[share.correction] band_low"),
    ("[share]\nis_band_high = 4.0\n", "[share.correction] band_high"),
])
def test_a_renamed_key_is_one_line_naming_the_new_key(tmp_path: Path, text: str, new_key: str) -> None:
    error = config_error(tmp_path, text)
    old = text.split("\n")[1].split(" =")[0]
    assert error.startswith(f"share.{old} in c.toml is no longer a key: use {new_key}")
    assert "\n" not in error


def test_the_new_correction_table_loads(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[share.correction]\nkind = "ftis"\ncap = 0.5\nband_low = 0.25\n')
    correction = load_config(f).share.correction
    assert (correction.kind, correction.knobs()) == ("ftis", {"cap": 0.5, "band_low": 0.25, "band_high": 8.0})
    # a flag picks another kind over the file's
    assert load_config(None, {"share.correction.kind": "none"}).share.correction.knobs() == {}


@pytest.mark.parametrize(("text", "message"), [
    ('[sampler]\nkind = "hf"\nkv_cache_gb = 1.0\n',
     "sampler.kv_cache_gb is a setting of sampler.kind vllm | auto, not of the selected 'hf'"),
    ('[sampler]\nkind = "hf"\nmax_num_seqs = 8\n',
     "sampler.max_num_seqs is a setting of sampler.kind vllm | auto, not of the selected 'hf'"),
    ('[share.correction]\nkind = "none"\ncap = 0.5\n',
     "share.correction.cap is a setting of share.correction.kind is | decoupled | ftis, not of the selected 'none'"),
    ("[share.correction]\nband_low = 0.2\n",
     "share.correction.band_low is a setting of share.correction.kind ftis, not of the selected 'is'"),
    ('[share.correction]\nkind = "best"\n', "share.correction.kind 'best' unknown; choose one of none, is, ftis"),
    ("[share.correction]\nwidth = 2\n", "unknown key 'share.correction.width' in c.toml; known: band_high, band_low"),
])
def test_a_key_of_a_variant_not_selected_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    error = config_error(tmp_path, text)
    assert error.startswith(message)
    assert "\n" not in error


def test_the_variant_classes_are_chosen_by_kind() -> None:
    from swarm_node.config import AutoSamplerConfig, HFSamplerConfig, ISCorrectionConfig, VLLMSamplerConfig

    assert type(load_config().sampler) is AutoSamplerConfig and type(load_config().share.correction) is \
        ISCorrectionConfig
    vllm = load_config(None, {"sampler.kind": "vllm", "sampler.kv_cache_gb": 0.5}).sampler
    assert type(vllm) is VLLMSamplerConfig and vllm.engine_knobs() == {
        "threads": 0, "max_model_len": 0, "kv_cache_gb": 0.5, "max_num_seqs": 0}
    hf = load_config(None, {"sampler.kind": "hf", "sampler.temperature": 0.5}).sampler
    assert type(hf) is HFSamplerConfig and (hf.temperature, hf.engine_knobs()) == (0.5, {})


def test_a_loaded_config_cannot_be_assigned_to() -> None:
    import dataclasses

    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.run.steps = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.share.correction.cap = 0.5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.sampler = cfg.sampler  # type: ignore[misc]


def test_with_values_is_a_checked_copy() -> None:
    cfg = load_config()
    changed = cfg.with_values({"run.seed": 5, "share.correction.cap": 0.5})
    assert (changed.run.seed, changed.share.correction.knobs(), cfg.run.seed, cfg.share.correction.knobs()) == \
        (5, {"cap": 0.5}, None, {"cap": 1.0})
    with pytest.raises(ConfigError, match="^run.seed must be an integer, got True$"):
        cfg.with_values({"run.seed": True})
    with pytest.raises(ConfigError, match="^unknown key 'run.sead'$"):
        cfg.with_values({"run.sead": 1})
    with pytest.raises(ConfigError, match="^share.correction.kind: a variant's kind is chosen when the config"):
        cfg.with_values({"share.correction.kind": "none"})
    with pytest.raises(ConfigError, match="^run.steps must be > 0"):
        cfg.with_values({"run.steps": 0})


def test_every_scenario_file_loads_its_node_configs(tmp_path: Path) -> None:
    """The TOML files of the repository keep working (scenarios hold [config] tables of node keys)."""
    from simulations.scenario import load_scenario

    scenarios = sorted((Path(__file__).parents[2] / "simulations" / "scenarios").glob("*.toml"))
    assert scenarios
    for path in scenarios:
        scn = load_scenario(path)
        for variant in scn.variants:
            for index in range(scn.nodes):
                assert scn.node_config(variant, index, 0, tmp_path).run.steps == scn.rounds


def test_the_readme_configuration_block_loads_as_the_defaults(tmp_path: Path) -> None:
    """README.md's [Configuration] example is a working file, and it states the defaults."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("## Configuration", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    f = tmp_path / "readme.toml"
    f.write_text(block)
    from swarm_node.config import NodeConfig

    loaded, default = load_config(f), NodeConfig()
    assert loaded.task.mix and loaded.task.specialties() == default.task.specialties()  # the mix written out
    assert loaded.with_values({"task.mix": []}).to_dict() == default.to_dict()
