"""The typed node configuration: one frozen dataclass per section, one class per variant, loaded as defaults <
TOML file < CLI overrides and validated (`load_config`); nothing changes it after loading.

- `schema.py`   mapping -> frozen config: key and type checks, variants chosen by `kind`, dotted replacement
- `checks.py`   the one-line value checks the sections share
- `run.py`      [run], [model], [task]; [run.rollout]: one class per rollout mode (`ROLLOUT_CONFIGS`)
- `sampler.py`  [sampler]: one class per sampler kind (`SAMPLER_CONFIGS`)
- `train.py`    [train] and [train.stale_correction]: one class per stale-rollout correction
                (`STALE_CORRECTION_CONFIGS`)
- `share.py`    [share] and [share.correction]: one class per correction (`CORRECTION_CONFIGS`)
- `peers.py`    [peers]
- `network.py`  [network], [echo], [status]
- `node.py`     `NodeConfig`: the sections and the checks across them
- `loading.py`  `load_config`, `build_config` (layers), `read_toml`, the renamed keys
"""

from swarm_node.config.loading import RENAMED, build_config, load_config, nest, read_toml
from swarm_node.config.network import EchoConfig, NetworkConfig, StatusConfig
from swarm_node.config.node import NodeConfig
from swarm_node.config.peers import PeersConfig
from swarm_node.config.run import (
    ROLLOUT_CONFIGS,
    AprilRolloutConfig,
    DynamicRolloutConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    TaskConfig,
)
from swarm_node.config.sampler import (
    SAMPLER_CONFIGS,
    AutoSamplerConfig,
    HFSamplerConfig,
    SamplerConfig,
    VLLMSamplerConfig,
)
from swarm_node.config.share import (
    CORRECTION_CONFIGS,
    CappedCorrectionConfig,
    CorrectionConfig,
    DecoupledCorrectionConfig,
    FTISCorrectionConfig,
    ISCorrectionConfig,
    ShareConfig,
)
from swarm_node.config.train import (
    STALE_CORRECTION_CONFIGS,
    M2POStaleConfig,
    StaleCorrectionConfig,
    TISStaleConfig,
    TrainConfig,
    VCPOStaleConfig,
)

__all__ = [
    "CORRECTION_CONFIGS", "RENAMED", "ROLLOUT_CONFIGS", "AprilRolloutConfig", "DynamicRolloutConfig", "RolloutConfig",
    "SAMPLER_CONFIGS", "STALE_CORRECTION_CONFIGS", "M2POStaleConfig",
    "StaleCorrectionConfig", "TISStaleConfig", "VCPOStaleConfig", "AutoSamplerConfig", "CappedCorrectionConfig",
    "CorrectionConfig", "DecoupledCorrectionConfig", "EchoConfig", "FTISCorrectionConfig", "HFSamplerConfig",
    "ISCorrectionConfig", "ModelConfig", "NetworkConfig", "NodeConfig", "PeersConfig", "RunConfig", "SamplerConfig",
    "ShareConfig", "StatusConfig", "TaskConfig", "TrainConfig", "VLLMSamplerConfig", "build_config", "load_config",
    "nest", "read_toml",
]
