"""llama-swap's `config.yaml`, loaded and checked. See `load_config`."""

from .errors import ConfigError, Problem
from .filters import ModelFilters
from .files import load_config
from .loader import Config, parse_config
from .model import ModelConfig
from .routing import SchedulerConfig

__all__ = [
    "Config",
    "ConfigError",
    "ModelConfig",
    "ModelFilters",
    "Problem",
    "SchedulerConfig",
    "load_config",
    "parse_config",
]
