"""Where a config comes from: the file given with --config, merged with the files of --config-dir
when one is given."""

from __future__ import annotations

import os

from .config_dir import load_merged
from .loader import Config, parse_config, read_config_text


def load_config(path: str | os.PathLike | None, config_dir: str | os.PathLike | None = None) -> Config:
    """Read and check the file at `path`, merged with the files of `config_dir` when one is given
    (`--config-dir`, see `config_dir.load_merged`); raises ConfigError listing every problem."""
    if config_dir:
        return load_merged(path, config_dir)
    return parse_config(read_config_text(path), str(path))
