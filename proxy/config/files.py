"""Where a config comes from: the file given with --config, merged with the files of --config-dir
when one is given."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .config_dir import load_merged
from .loader import Config, parse_config, read_config_text


def load_config(path: str | os.PathLike | None, config_dir: str | os.PathLike | None = None,
                kept_ports: Mapping[str, int] | None = None) -> Config:
    """Read and check the file at `path`, merged with the files of `config_dir` when one is given
    (`--config-dir`, see `config_dir.load_merged`); raises ConfigError listing every problem. `kept_ports`: the
    ${PORT} numbers a reload keeps (`loader.check_document`)."""
    if config_dir:
        return load_merged(path, config_dir, kept_ports)
    return parse_config(read_config_text(path), str(path), kept_ports)
