"""Typed node configuration: one dataclass per component, loaded as defaults < TOML file < CLI overrides.

A TOML file has one table per component ([run], [model], [task], [sampler], [train], [share], [status],
[network], [peers]); CLI flags arrive as dotted overrides ("train.lr" -> 1e-4). Unknown keys, wrong types and impossible
values raise `ConfigError` with one line naming the key.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from protocol.relay import DEFAULT_SCHEDULE, ScheduleError, make_plan
from swarm_node import variants
from swarm_node.errors import ConfigError
from swarm_node.tasks import DATASET_SIZE, DEFAULT_MIX, TaskSource, parse_specialties


@dataclass
class RunConfig:
    steps: int = 200
    prompts_per_step: int = 16  # B: prompts drawn per step
    group_size: int = 8  # G: completions per prompt
    seed: int = 0
    run_dir: str = "runs/solo"
    resume: bool = False
    checkpoint_every: int = 25
    keep_checkpoints: int = 3
    eval_every: int = 0  # 0: only at the end of the run
    eval_problems: int = 200  # 0: no held-out eval
    # Hardware (model/device.py, train/sizing.py, node/hardware.py): where the node computes, and the memory one
    # step may take. device: variants.DEVICES, "cuda:N" for a card; memory_budget_mib 0: a safe fraction of the
    # device's memory (RAM on CPU, VRAM on a GPU). memory_guard false: size by the estimate alone and do not watch
    # the process's memory (a node sharing its process with others: simulations).
    device: str = "auto"
    memory_budget_mib: int = 0
    memory_guard: bool = True

    def validate(self) -> None:
        _positive(self, "steps", "prompts_per_step", "group_size", "checkpoint_every", "keep_checkpoints")
        _non_negative(self, "eval_every", "seed", "eval_problems", "memory_budget_mib")
        kind, sep, index = self.device.partition(":")
        if kind not in variants.DEVICES or (sep and (kind != "cuda" or not index.isdigit())):
            raise ConfigError(f"run.device {self.device!r} unknown; choose one of auto, cpu, cuda, cuda:N, mps")


@dataclass
class ModelConfig:
    path: str = ""  # empty: the embedded default model

    def validate(self) -> None:
        pass


@dataclass
class TaskConfig:
    """The task: by default the embedded mix (`tasks.DEFAULT_MIX`); or one task (`name`, `options`); or a mix:
    `mix = [{name = "chain_sum", options = {...}, weight = 1.0}, ...]`. `accept`: the (name, options) entries
    taken from peers, default the mix drawn."""

    name: str = ""  # empty: the mix (the default mix when `mix` is empty too)
    options: dict[str, Any] = field(default_factory=dict)  # empty: the task's defaults (see tasks/reference.py)
    seed: int = 0
    reward: str = "exact"  # variants.REWARD_MODES: exact | score (reasoning-gym's partial credit)
    selection: str = "balanced"  # variants.TASK_SELECTIONS: uniform | weighted | balanced (each prompt's specialty)
    mix: list[dict[str, Any]] = field(default_factory=list)  # empty: `name`, or else tasks.DEFAULT_MIX
    accept: list[dict[str, Any]] = field(default_factory=list)  # empty: our own mix

    def validate(self) -> None:
        _non_negative(self, "seed")
        _one_of(self, "reward", variants.REWARD_MODES)
        _one_of(self, "selection", variants.TASK_SELECTIONS)
        if self.mix and (self.name or self.options):
            raise ConfigError("task.mix replaces task.name and task.options: set one or the other")
        if self.options and not self.name:
            raise ConfigError("task.options needs task.name (the dataset the options are for)")
        parse_specialties(self.mix, "task.mix")
        parse_specialties(self.accept, "task.accept", weighted=False)

    def specialties(self) -> list[dict[str, Any]]:
        """The mix drawn, as config entries: `mix`, else the one task `name`, else the embedded default mix."""
        if self.mix:
            return self.mix
        if self.name:
            return [{"name": self.name, "options": self.options}]
        return copy.deepcopy(list(DEFAULT_MIX))

    def build_source(self, size: int = DATASET_SIZE) -> TaskSource:
        """The node's task source (builds every dataset: an unknown dataset or bad options fail here)."""
        return TaskSource(seed=self.seed, size=size, reward=self.reward, selection=self.selection,
                          mix=self.specialties(), accept=self.accept)


@dataclass
class SamplerConfig:
    kind: str = "auto"  # variants.SAMPLER_KINDS: auto | vllm | hf
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    threads: int = 0  # 0: derived from the machine (see sampler/vllm_sampler.py)
    max_model_len: int = 0  # 0: derived from the model
    kv_cache_gb: float = 0.0  # 0: derived from max_model_len and batch size
    max_num_seqs: int = 0

    def validate(self) -> None:
        _one_of(self, "kind", variants.SAMPLER_KINDS)
        if not 0 < self.temperature <= 10:
            raise ConfigError(f"sampler.temperature must be in (0, 10], got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampler.top_p must be in (0, 1], got {self.top_p}")
        _positive(self, "max_new_tokens")
        _non_negative(self, "threads", "max_model_len", "kv_cache_gb", "max_num_seqs")


@dataclass
class TrainConfig:
    lr: float = 1e-4
    warmup_steps: int = 10  # optimizer steps of linear lr warm-up: Adam's first steps are sign-like and large
    minibatches: int = 2  # optimizer steps per batch
    advantage: str = "grpo"  # rl.advantages registry
    loss: str = "grpo"  # rl.loss registry
    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    is_cap: float = 2.0  # truncation of importance weights for off-policy rollouts
    max_staleness: int = 0  # S: version lag allowed between generation and training; >= 1 overlaps them
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    threads: int = 0  # torch intra-op threads; 0: all cores
    # Padded positions (rows x longest row) per forward/backward (train/batching.py). The default run's minibatches
    # (64 rows of ~84 tokens) fit in one micro-batch, so it computes exactly as an unsplit batch; 64 rows at the
    # default model's full context (256) take two. Logits are positions x vocabulary floats: lower this for a
    # large-vocabulary model.
    microbatch_tokens: int = 8192
    # LoRA (swarm_node/lora.py): 0 trains every weight; r > 0 freezes the base and trains rank-r adapters on the
    # attention and MLP projections (scale lora_alpha / r). A simulation's shared vLLM engine serves them.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    # variants.PRECISIONS (model/device.py): "auto" is bf16 autocast on a GPU that supports it, else fp32; the
    # weights and the optimizer state stay fp32 (master weights) either way.
    precision: str = "auto"

    def validate(self) -> None:
        _one_of(self, "advantage", variants.ADVANTAGES)
        _one_of(self, "precision", variants.PRECISIONS)
        _one_of(self, "loss", variants.LOSSES)
        _positive(self, "lr", "minibatches", "max_grad_norm", "is_cap", "microbatch_tokens")
        _non_negative(self, "eps_low", "eps_high", "kl_coef", "weight_decay", "threads", "warmup_steps",
                      "max_staleness")
        _positive(self, "adam_eps", "lora_alpha")
        _non_negative(self, "lora_rank")


@dataclass
class ShareConfig:
    """Experience sharing (SAPO): each update trains on I local + J external groups.

    local_groups 0 means run.prompts_per_step (solo); external_groups 0 means no external groups are used
    (received groups are still re-scored and pooled). max_external_age counts our own training steps since a
    group was received. external_correction (sharing/corrections.py) weights external completions by
    r = pi_local / mu_sender: "none" trains them as on-policy (SAPO, rl-swarm); "is" by a truncated
    sequence-level ratio; "ftis" per token, dropping tokens whose r leaves [is_band_low, is_band_high]; "decoupled"
    by AReaL's decoupled objective. Every weight is capped at is_cap <= 1: a peer's log-probs may only shrink a
    gradient.
    """

    local_groups: int = 0
    external_groups: int = 0
    max_external_age: int = 4
    # variants.CORRECTIONS: none | is | ftis | decoupled. "is" is what the data supports: at 4 nodes x 300 rounds,
    # 4/4 with "none" lost 13% of cumulative reward to 8/0 and "is" was level (bench/results/sapo_sweep.json).
    external_correction: str = "is"
    is_cap: float = 1.0  # cap on every external completion's weight, <= 1
    is_band_low: float = 0.125  # ftis: tokens with r below this are dropped (prime-rl's token mask default)
    is_band_high: float = 8.0  # ftis: tokens with r above this are dropped
    pool_size: int = 256
    per_peer_pool_cap: int = 64
    per_peer_batch_cap: int = 0  # 0: no per-peer limit within one batch beyond external_groups
    selection: str = "uniform"  # variants.SELECTIONS (sharing/selection.py)
    # A peer's completion that is not well-formed (tasks.well_formed: the answer alone, then EOS) is re-scored 0.
    # false only to measure what the defence is worth (bench/attack.py): peers' verifier-passing junk then counts.
    require_well_formed: bool = True

    def validate(self) -> None:
        _non_negative(self, "local_groups", "external_groups", "max_external_age", "per_peer_batch_cap")
        _positive(self, "pool_size", "per_peer_pool_cap", "is_cap")
        _one_of(self, "external_correction", variants.CORRECTIONS)
        if self.is_cap > 1.0:
            raise ConfigError(f"share.is_cap must be <= 1 (peers' log-probs may only shrink a gradient), "
                              f"got {self.is_cap}")
        if not 0 <= self.is_band_low <= 1 <= self.is_band_high:
            raise ConfigError(f"share.is_band_low and share.is_band_high need 0 <= low <= 1 <= high, "
                              f"got [{self.is_band_low}, {self.is_band_high}]")
        _one_of(self, "selection", variants.SELECTIONS)


@dataclass
class StatusConfig:
    host: str = "127.0.0.1"
    port: int = 8470  # 0: ephemeral; -1: no status server
    token: str = ""

    def validate(self) -> None:
        if not -1 <= self.port <= 65535:
            raise ConfigError(f"status.port must be -1 (off), 0 (ephemeral) or a port number, got {self.port}")


@dataclass
class PeersConfig:
    """Hostile peers (sharing/budget.py, sharing/reputation.py). rescore_share: seconds of re-scoring work per wall
    second for all peers together (of one core), split equally among the peers active in the last active_window_s;
    a peer may save up burst_s. Reputation decays with half_life_s; at graylist_score a peer's messages are ignored
    unread, at ban_score it is banned for ban_s (kept in RUN_DIR/peers.json; `swarm-node peers unban`). weights:
    score change per event kind (drop reason, "forged_reward", "accepted"), over the defaults. allow: never
    graylisted nor banned; deny: always ignored."""

    rescore_share: float = 0.2
    burst_s: float = 5.0
    # Rollout messages per signer, before any decoding (sharing/ingest.PeerGuard's rate; 0: no limit). A peer sends
    # one message per training step (up to 16 groups); past the rate its messages are ignored unread (not held against
    # it: a fast honest peer may exceed it). Measured once (40 s, loaded 2-core machine): 3 identities flooding
    # valid 1-group messages at ~13/s each cost a sharing `join` 25% of its steps per minute without the cap, 17%
    # with 5/s (issue 14).
    max_messages_per_s: float = 5.0
    message_burst: float = 50.0
    active_window_s: float = 60.0
    half_life_s: float = 600.0
    graylist_score: float = -20.0
    ban_score: float = -50.0
    ban_s: float = 3600.0
    weights: dict[str, float] = field(default_factory=dict)
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)

    def validate(self) -> None:
        _positive(self, "rescore_share", "burst_s", "active_window_s", "half_life_s", "ban_s")
        _non_negative(self, "max_messages_per_s")
        if self.message_burst < 1:
            raise ConfigError(f"peers.message_burst must be >= 1, got {self.message_burst}")
        if not self.ban_score <= self.graylist_score < 0:
            raise ConfigError(f"peers needs ban_score <= graylist_score < 0, got ban_score {self.ban_score}, "
                              f"graylist_score {self.graylist_score}")
        for kind, value in self.weights.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"peers.weights.{kind} must be a finite number, got {value!r}")
        for name in ("allow", "deny"):
            for peer in getattr(self, name):
                if not isinstance(peer, str) or not peer.isalnum():
                    raise ConfigError(f"peers.{name}: {peer!r} is not a peer id (e.g. 12D3KooW...)")
        both = set(self.allow) & set(self.deny)
        if both:
            raise ConfigError(f"peer {sorted(both)[0]} is on both peers.allow and peers.deny")


@dataclass
class NetworkConfig:
    """libp2p settings for `join`: listen/announce multiaddrs without /p2p, bootstrap multiaddrs with it."""

    role: str = "peer"  # variants.ROLES: peer (SAPO) | learner | worker (ECHO-2)
    learner: str = ""  # worker: the learner's peer id to follow
    listen: str = "/ip4/0.0.0.0/tcp/0"
    announce_addr: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    identity: str = ""  # key file; empty: RUN_DIR/identity.key (created on first use)
    # Serve as a circuit relay for peers behind NAT: auto = once AutoNAT says we are public (docs/NAT.md).
    relay: str = "auto"  # auto | on | off
    relay_circuit_mb: int = 64  # bytes one relayed circuit may carry before the relay resets it
    relay_max_reservations: int = 32  # peers that may hold a slot on us as a relay
    # Ask the router to forward our listen port by UPnP first, where it offers that (docs/NAT.md).
    upnp: bool = True

    def validate(self) -> None:
        _one_of(self, "role", variants.ROLES)
        _one_of(self, "relay", variants.RELAY_MODES)
        if self.relay_circuit_mb < 1 or self.relay_max_reservations < 0:
            raise ConfigError("network.relay_circuit_mb must be >= 1 and network.relay_max_reservations >= 0")
        if not isinstance(self.upnp, bool):
            raise ConfigError(f"network.upnp must be true or false, got {self.upnp!r}")
        if self.role == "worker" and not self.learner:
            raise ConfigError("a worker needs the learner to follow: --learner PEER_ID (printed by the learner)")
        for addr in [self.listen, *self.announce_addr, *self.bootstrap]:
            if not isinstance(addr, str) or not addr.startswith("/"):
                raise ConfigError(f"{addr!r} is not a multiaddr (e.g. /ip4/1.2.3.4/tcp/4001/p2p/12D3Koo...)")
        for addr in self.bootstrap:
            if "/p2p/" not in addr:
                raise ConfigError(f"bootstrap address {addr!r} lacks the peer id (/p2p/...)")
        if "/tcp/" not in self.listen or "/udp/" in self.listen:
            # py-libp2p 0.8.1's QUIC loses data and cannot hole-punch (docs/NAT.md): the host builds TCP only, and
            # a QUIC listen address would silently listen on nothing.
            raise ConfigError(f"network.listen {self.listen!r}: the node listens on TCP only "
                              f"(/ip4/0.0.0.0/tcp/PORT); py-libp2p 0.8.1's QUIC is not used (docs/NAT.md)")


@dataclass
class EchoConfig:
    """ECHO-2 mode: how a learner publishes its policy and how workers report (see swarm_node/echo.py)."""

    encoding: str = "topk"  # variants.CODECS: policy delta encoding (policy_sync/codecs.py)
    publish_every: int = 1  # kappa: publish a policy update every kappa learner steps
    schedule: str = DEFAULT_SCHEDULE  # relay schedule for the pipelined broadcast (protocol.relay)
    chunk_bytes: int = 1 << 20
    keep_versions: int = 8  # updates kept to serve late joiners
    heartbeat_s: float = 5.0  # a worker's status message period
    cost_per_hour: float = 0.0  # a worker's price, reported to its learner, which prefers cheap throughput
    snapshot_every: int = 25  # the learner also publishes a full snapshot every N updates, for joiners
    # A worker refuses an update whose L2 norm (new - current policy) exceeds this per published step (0: off).
    # Measured on the default model (train.lr 1e-4, topk and dense-bf16): 0.01-0.17 per update; 10.0 is ~60x that.
    # The norm grows with lr and sqrt(parameters): raise it for a larger model or learning rate.
    max_delta_norm: float = 10.0

    def validate(self) -> None:
        _one_of(self, "encoding", variants.CODECS)
        try:
            make_plan(self.schedule, "source", ["receiver"])
        except ScheduleError as exc:
            raise ConfigError(f"echo.schedule: {exc}") from exc
        _positive(self, "publish_every", "chunk_bytes", "keep_versions", "heartbeat_s", "snapshot_every")
        _non_negative(self, "cost_per_hour", "max_delta_norm")


@dataclass
class NodeConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    share: ShareConfig = field(default_factory=ShareConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    echo: EchoConfig = field(default_factory=EchoConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)

    def validate(self) -> NodeConfig:
        for section in dataclasses.fields(self):
            getattr(self, section.name).validate()
        if self.network.role != "peer" and self.echo.publish_every > self.train.max_staleness + 1:
            raise ConfigError(f"echo.publish_every ({self.echo.publish_every}) must be <= train.max_staleness + 1 "
                              f"({self.train.max_staleness + 1}): rollouts between publishes could never be trained on")
        if self.network.role != "peer" and self.train.lora_rank:
            raise ConfigError(f"train.lora_rank must be 0 for role {self.network.role!r}: ECHO-2 publishes "
                              "full-weight policy deltas")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(toml_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> NodeConfig:
    """Defaults, then the TOML file, then dotted CLI overrides (None values are skipped); validated."""
    config = NodeConfig()
    if toml_path is not None:
        path = Path(toml_path)
        apply_mapping(config, read_toml(path, "config file"), where=f" in {path.name}")
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        apply_mapping(config, {section: {key: value}}, where=" (command line)")
    return config.validate()


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file's tables; a missing or malformed file is one ConfigError line naming it."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} {str(path)!r} not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {exc}") from exc


def apply_mapping(target: Any, data: dict[str, Any], where: str = "", prefix: str = "") -> None:
    """Set dataclass fields from a nested mapping, checking every key and value type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}{where} must be a table")
    fields = {f.name: f for f in dataclasses.fields(target)}
    hints = typing.get_type_hints(type(target))
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(f"unknown key {name!r}{where}; known: {', '.join(sorted(fields))}")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            apply_mapping(current, value, where, prefix=f"{name}.")
        else:
            setattr(target, key, _coerce(value, hints[key], name, where))


def _coerce(value: Any, hint: Any, name: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    expected = origin or hint
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{name}{where} must be true or false, got {value!r}")
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"{name}{where} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"{name}{where} must be {expected.__name__}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}{where} must be finite, got {value!r}")
    return value


def _section(obj: Any) -> str:
    return type(obj).__name__.removesuffix("Config").lower()


def _one_of(obj: Any, name: str, names: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in names:
        raise ConfigError(f"{_section(obj)}.{name} {value!r} unknown; choose one of {', '.join(names)}")


def _positive(obj: Any, *names: str) -> None:
    section = _section(obj)
    for n in names:
        if getattr(obj, n) <= 0:
            raise ConfigError(f"{section}.{n} must be > 0, got {getattr(obj, n)}")


def _non_negative(obj: Any, *names: str) -> None:
    section = _section(obj)
    for n in names:
        if getattr(obj, n) < 0:
            raise ConfigError(f"{section}.{n} must be >= 0, got {getattr(obj, n)}")
