"""--config-dir: files merged as llama-swap merges them, every problem naming its file."""

import textwrap

import pytest

from proxy.config import ConfigError, load_config
from proxy.config.config_dir import sources_signature

MODEL = "{name}: {{cmd: run {name}, proxy: 'http://127.0.0.1:9{port}'}}"


def files(tmp_path, **texts) -> str:
    """Write `name=text` files into tmp_path/conf.d (underscores in names become dots); returns the directory."""
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir(exist_ok=True)
    for name, text in texts.items():
        (conf_d / name.replace("_", ".")).write_text(textwrap.dedent(text))
    return str(conf_d)


def test_files_merge_in_filename_order_after_config(tmp_path):
    (tmp_path / "config.yaml").write_text("models:\n  a: {cmd: run a, proxy: 'http://127.0.0.1:9001'}\n")
    conf_d = files(
        tmp_path,
        b_yaml="models:\n  b: {cmd: run b, proxy: 'http://127.0.0.1:9002'}\n",
        a_yml="groups:\n  g: {members: [a, b]}\n",
        skipped_txt="models: {z: {}}\n",
        empty_yaml="# switched off\n",
    )
    config = load_config(tmp_path / "config.yaml", conf_d)
    assert sorted(config.models) == ["a", "b"]
    assert [group.members for group in config.groups if group.name == "g"] == [("a", "b")]
    assert config.path.split(" + ") == [str(tmp_path / "config.yaml"), f"{conf_d}/a.yml", f"{conf_d}/b.yaml", f"{conf_d}/empty.yaml"]


def test_nested_identity_maps_refuse_an_id_twice(tmp_path):
    conf_d = files(
        tmp_path,
        one_yaml="""
            models:
              a: {cmd: run a, proxy: 'http://127.0.0.1:9001'}
            routing: {router: {settings: {groups: {g: {members: [a]}}}}}
        """,
        two_yaml="routing: {router: {settings: {groups: {g: {members: [a]}}}}}\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(None, conf_d)
    assert str(info.value) == (
        f"{conf_d}/two.yaml: routing.router.settings.groups.g: defined in both {conf_d}/one.yaml and {conf_d}/two.yaml"
        " — define each ID in one file only"
    )


def test_same_value_twice_is_fine_and_a_null_gives_way(tmp_path):
    conf_d = files(
        tmp_path,
        a_yaml="globalTTL: 60\nlogLevel: ~\nmacros: {x: 1}\nmodels:\n  a: {cmd: run a, proxy: 'http://127.0.0.1:9001'}\n",
        b_yaml="globalTTL: 60\nlogLevel: warn\nmacros: {y: 2}\n",
    )
    config = load_config(None, conf_d)
    assert config.global_ttl == 60 and config.log_level == "warn"


def test_problems_and_warnings_name_the_file_that_set_the_key(tmp_path):
    conf_d = files(
        tmp_path,
        a_yaml="models:\n  a: {cmd: run a, proxy: 'http://127.0.0.1:9001', ttl: soon}\n",
        b_yaml="models:\n  b: {cmd: run b, proxy: 'http://127.0.0.1:9002', colour: red}\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(None, conf_d)
    assert str(info.value).startswith(f"{conf_d}/a.yaml: models.a.ttl: expected a number")
    (tmp_path / "conf.d" / "a.yaml").write_text("models:\n  a: {cmd: run a, proxy: 'http://127.0.0.1:9001'}\n")
    (warning,) = load_config(None, conf_d).warnings
    assert warning.startswith(f"{conf_d}/b.yaml: models.b.colour: ")


def test_a_bad_file_is_named(tmp_path):
    conf_d = files(tmp_path, a_yaml="models: [\n", b_yaml="- a list\n")
    with pytest.raises(ConfigError) as info:
        load_config(None, conf_d)
    assert str(info.value).startswith(f"{conf_d}/a.yaml: line ")
    (tmp_path / "conf.d" / "a.yaml").unlink()
    with pytest.raises(ConfigError, match="the top level must be a mapping") as info:
        load_config(None, conf_d)
    assert info.value.path == f"{conf_d}/b.yaml"


def test_an_empty_directory_without_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="holds no \\*.yaml or \\*.yml file"):
        load_config(None, files(tmp_path))


def test_the_signature_changes_when_a_file_is_added_changed_or_removed(tmp_path):
    conf_d = files(tmp_path, a_yaml="x: 1\n")
    first = sources_signature(None, conf_d)
    (tmp_path / "conf.d" / "b.yml").write_text("y: 2\n")
    added = sources_signature(None, conf_d)
    (tmp_path / "conf.d" / "b.yml").write_text("y: 22\n")
    changed = sources_signature(None, conf_d)
    (tmp_path / "conf.d" / "b.yml").unlink()
    (tmp_path / "conf.d" / "c.txt").write_text("ignored\n")
    assert len({first, added, changed}) == 3 and sources_signature(None, conf_d) == first


def test_a_config_file_inside_the_directory_is_read_once(tmp_path):
    conf_d = files(
        tmp_path,
        main_yaml="models:\n  m1: {cmd: run m1, proxy: 'http://127.0.0.1:9001'}\n",
        other_yaml="models:\n  m2: {cmd: run m2, proxy: 'http://127.0.0.1:9002'}\n",
    )
    for given in (f"{conf_d}/main.yaml", tmp_path / "conf.d" / ".." / "conf.d" / "main.yaml"):
        config = load_config(given, conf_d)
        assert sorted(config.models) == ["m1", "m2"]
        assert config.path.split(" + ") == [f"{conf_d}/main.yaml", f"{conf_d}/other.yaml"]


def test_a_null_model_entry_gives_way_to_the_other_files_model(tmp_path):
    (tmp_path / "config.yaml").write_text("models:\n  m1: {cmd: run m1, proxy: 'http://127.0.0.1:9001'}\n")
    conf_d = files(tmp_path, later_yaml="models:\n  m1: null\n  m2: {cmd: run m2, proxy: 'http://127.0.0.1:9002'}\n")
    config = load_config(tmp_path / "config.yaml", conf_d)
    assert config.models["m1"].cmd == ("run", "m1") and sorted(config.models) == ["m1", "m2"]
    (tmp_path / "config.yaml").write_text("models:\n  m1: null\n")
    conf_d = files(tmp_path, later_yaml="models:\n  m1: {cmd: run m1, proxy: 'http://127.0.0.1:9001'}\n")
    assert load_config(tmp_path / "config.yaml", conf_d).models["m1"].cmd == ("run", "m1")


def test_a_files_key_that_holds_yaml_anchors_is_named_with_its_file(tmp_path):
    conf_d = files(tmp_path, models_yaml="""
        shared: &shared {ttl: 60}
        models:
          a: {<<: *shared, cmd: run a, proxy: 'http://127.0.0.1:9001'}
        """)
    config = load_config(None, conf_d)
    assert config.models["a"].ttl == 60
    assert config.warnings == (f"{conf_d}/models.yaml: shared: not a setting: it holds the YAML anchors &shared that "
                               "other entries use, and is otherwise ignored, as llama-swap ignores it",)
