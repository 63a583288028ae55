"""The `llamaswap` console script: the project's manage.py, installed on PATH."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    argv = argv if argv is not None else sys.argv
    if argv[1:] == ["--version"]:  # llamaswap's version, not Django's (`llamaswap serve --version` says the same)
        from proxy.version import llamaswap_version

        print(f"llamaswap {llamaswap_version()}")
        return
    if argv[1:2] == ["fakemodel"]:
        # The stand-in model server needs no Django: loading the settings would create a data dir and a
        # secret key wherever it is started.
        from fakemodel import server

        raise SystemExit(server.main(argv[2:]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llamaswap_site.settings")
    from llamaswap_site.environment import EnvironmentProblem

    try:
        import llamaswap_site.settings  # noqa: F401 (read now, so a wrong variable is one line, not a traceback)
    except EnvironmentProblem as exc:
        raise SystemExit(f"llamaswap: {exc}") from None
    from django.core.management import execute_from_command_line

    execute_from_command_line(argv)
