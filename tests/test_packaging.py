"""The editable install `make venv` makes (`pip install -e .`): setuptools takes the repository's folder as a path
entry, as the flat layout needs, rather than its import finder, whose boxed warning about folders named like the
packages reads as an error at the end of `make run`'s first output."""

from __future__ import annotations

import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def editable_strategy(tmp_path):
    """The strategy setuptools' editable_wheel command picks for this pyproject.toml, as a build of it would."""
    from setuptools.command.editable_wheel import editable_wheel
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # setuptools' note that [tool.setuptools] support is beta, in older releases
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    command = editable_wheel(dist)
    command.ensure_finalized()
    return command._select_strategy("llamaswap", "0.editable-py3-none-any", str(tmp_path))


def test_the_editable_install_is_a_path_entry_to_the_repository_and_warns_of_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    strategy = editable_strategy(tmp_path)
    assert [Path(entry).resolve() for entry in strategy.path_entries] == [REPO]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with strategy:
            pass
    assert not [str(w.message) for w in caught]

