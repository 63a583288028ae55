"""A reload hands unchanged models' processes their new config entry (unloadTimeout, healthCheckTimeout)
and keeps the process; only models whose process changed get a new one."""

from __future__ import annotations

from proxy.config import load_config
from proxy.model_processes.fleet import ProcessFleet, process_changed


def config(tmp_path, name: str, *, health: int, unload: int, tokens: int = 16):
    path = tmp_path / name
    path.write_text(
        f"healthCheckTimeout: {health}\n"
        "startPort: 20000\n"
        "models:\n"
        "  kept:\n"
        "    cmd: fakeserver --port ${PORT}\n"
        f"    unloadTimeout: {unload}\n"
        "  changed:\n"
        f"    cmd: fakeserver --port ${{PORT}} --tokens {tokens}\n"
    )
    return load_config(path)


def test_an_unchanged_model_keeps_its_process_under_the_new_entry_and_a_changed_one_gets_a_new_process(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LLAMASWAP_ALLOW_SHORT_HEALTH_TIMEOUT", "1")
    old = config(tmp_path, "old.yaml", health=30, unload=2)
    new = config(tmp_path, "new.yaml", health=3, unload=9, tokens=4)
    restart = [m for m in new.models if process_changed(old.models[m], new.models[m])]
    assert restart == ["changed"]

    fleet = ProcessFleet(old, recorder=None, on_crash=lambda model: None)
    kept, changed = fleet.processes["kept"], fleet.processes["changed"]
    fleet.apply(new, restart)

    assert fleet.processes["kept"] is kept
    assert kept.config is new.models["kept"] and kept.config.unload_timeout == 9
    assert kept.health_check_timeout == 3
    assert fleet.processes["changed"] is not changed  # stopped, so nothing is left to retire
    assert fleet.processes["changed"].config.cmd[-1] == "4" and fleet.processes["changed"].health_check_timeout == 3


def test_with_hardware_a_model_whose_memory_or_gpu_count_changed_gets_a_new_process_placed_again(tmp_path):
    def placed(name: str, memory: str, gpus: int):
        path = tmp_path / name
        path.write_text(
            "hardware: {gpus: [{id: 0, memory: 24GiB}, {id: 1, memory: 24GiB}]}\n"
            "models:\n"
            "  same: {cmd: 'fakeserver --port ${PORT}', memory: 4GiB}\n"
            f"  moved: {{cmd: 'fakeserver --port ${{PORT}}', memory: {memory}, gpus: {gpus}}}\n"
        )
        return load_config(path)

    old = placed("old.yaml", "8GiB", 1)
    for name, memory, gpus in (("more.yaml", "12GiB", 1), ("wider.yaml", "8GiB", 2)):
        new = placed(name, memory, gpus)
        assert [m for m in new.models if process_changed(old.models[m], new.models[m])] == ["moved"]
