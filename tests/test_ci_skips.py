"""Under CI=true every kind of skip fails the run with its reason; elsewhere it stays a skip."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SKIPPING_TESTS = {
    "test_skips.py": """
        import pytest

        pytestmark = pytest.mark.skipif(True, reason="corpus not found")

        def test_marked():
            pass
    """,
    "test_skips_inside.py": """
        import pytest

        def test_skips_itself():
            pytest.skip("no chromium here")

        @pytest.mark.xfail(reason="known")
        def test_expected_failure():
            assert False

        def test_passes():
            pass
    """,
}
IMPORT_SKIP = """
    import pytest

    pytest.importorskip("a_module_that_is_not_installed")

    def test_never_collected():
        pass
"""


def run_pytest(folder: Path, ci: str | None) -> subprocess.CompletedProcess:
    """pytest on `folder`, whose conftest is the suite's own root conftest."""
    (folder / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir", str(folder), str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )


def write_tests(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


@pytest.mark.parametrize("ci", ["true", "TRUE"])
def test_under_ci_a_skip_fails_with_its_reason(tmp_path, ci):
    result = run_pytest(write_tests(tmp_path / "suite", SKIPPING_TESTS), ci)
    assert result.returncode == 1, result.stdout
    assert "skipped under CI=true, where every test must run: corpus not found" in result.stdout
    assert "skipped under CI=true, where every test must run: no chromium here" in result.stdout
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in result.stdout


def test_under_ci_a_module_that_skips_at_import_fails(tmp_path):
    result = run_pytest(write_tests(tmp_path / "suite", {"test_import_skip.py": IMPORT_SKIP}), "true")
    assert result.returncode != 0, result.stdout
    assert "could not import 'a_module_that_is_not_installed'" in result.stdout
    assert "skipped under CI=true" in result.stdout


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_outside_ci_a_skip_is_a_skip(tmp_path, ci):
    result = run_pytest(write_tests(tmp_path / "suite", {**SKIPPING_TESTS, "test_import_skip.py": IMPORT_SKIP}), ci)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 3 skipped, 1 xfailed" in result.stdout
