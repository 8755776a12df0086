"""Configuration: dataclass tree, TOML loading, overrides and validation."""

from kiln.config.load import apply_override, dump_toml, load_config, save_config
from kiln.config.schema import (
    CheckpointConfig,
    CompileConfig,
    Config,
    CpuConfig,
    DataConfig,
    DistributedConfig,
    MetricsConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    TrainingConfig,
)
from kiln.config.validate import is_import_path, validate
from kiln.errors import ConfigError

__all__ = [
    "CheckpointConfig",
    "CompileConfig",
    "Config",
    "CpuConfig",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "MetricsConfig",
    "ModelConfig",
    "OptimConfig",
    "PrecisionConfig",
    "TrainingConfig",
    "apply_override",
    "dump_toml",
    "is_import_path",
    "load_config",
    "save_config",
    "validate",
]
