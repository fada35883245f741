"""tallow's configuration: pydantic models of every setting, merged from flags, env and a file.

Use :func:`load_config` to get the effective :class:`TallowConfig` (the ``tallow`` commands and
the Python API both do), and :func:`add_config_arguments` to give a command every setting as a
flag; :data:`KEYWORDS` are the settings as keyword arguments. Imports no torch.
"""

from .cli_args import add_config_arguments, setting_flags
from .errors import ConfigError, Problem
from .keywords import KEYWORDS, Keyword
from .loader import CONFIG_ENV, config_from_mapping, dump_config, load_config
from .models import (
    SECTIONS,
    CacheConfig,
    LoggingConfig,
    ModelConfig,
    ParallelConfig,
    PluginsConfig,
    RunnerConfig,
    SchedulerConfig,
    ServerConfig,
    SpeculativeConfig,
    TallowConfig,
)
from .sources import env_var_name

__all__ = [
    "TallowConfig",
    "ModelConfig",
    "CacheConfig",
    "SchedulerConfig",
    "RunnerConfig",
    "SpeculativeConfig",
    "ParallelConfig",
    "ServerConfig",
    "PluginsConfig",
    "LoggingConfig",
    "SECTIONS",
    "ConfigError",
    "Problem",
    "load_config",
    "config_from_mapping",
    "dump_config",
    "add_config_arguments",
    "setting_flags",
    "env_var_name",
    "CONFIG_ENV",
    "KEYWORDS",
    "Keyword",
]
