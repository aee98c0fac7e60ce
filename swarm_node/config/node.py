"""`NodeConfig`: every section of a node's configuration, frozen once loaded, and the checks across sections."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from swarm_node.config.network import EchoConfig, NetworkConfig, StatusConfig
from swarm_node.config.peers import PeersConfig
from swarm_node.config.run import ModelConfig, RunConfig, TaskConfig
from swarm_node.config.sampler import AutoSamplerConfig, SamplerConfig
from swarm_node.config.schema import replace_values
from swarm_node.config.share import ShareConfig
from swarm_node.config.train import TrainConfig
from swarm_node.errors import ConfigError


@dataclass(frozen=True)
class NodeConfig:
    section: ClassVar[str] = "config"

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sampler: SamplerConfig = field(default_factory=lambda: AutoSamplerConfig())
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

    def with_values(self, dotted: Mapping[str, Any], where: str = "") -> NodeConfig:
        """A validated copy with dotted keys changed ({"run.resume": True}); this config stays as it is."""
        changed: NodeConfig = replace_values(self, dotted, where)
        return changed.validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
