"""The scheduler's runtime and front doors are importable before Django is set up: the benches drive them in a
process with no Django settings, and a module that touches the models at import time breaks them all."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_runtime_and_the_front_doors_import_without_django_settings():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", "import scheduling.runtime, scheduling.door.in_process, scheduling.door.remote, "
                               "scheduling.door.worker"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
