"""Settings read from the environment: distributed mode needs both Redis and PostgreSQL, and says so."""

from pathlib import Path

import pytest

from llamaswap_site.environment import channel_layers_from_url, database_from_url

SQLITE = database_from_url("", Path("/tmp/llamaswap-test.sqlite3"))
POSTGRES = database_from_url("postgres://llamaswap@db.example:5432/llamaswap", Path("/unused"))


def test_without_redis_there_is_no_channel_layer():
    assert channel_layers_from_url("", SQLITE) == {}
    assert channel_layers_from_url("", POSTGRES) == {}


def test_redis_with_postgres_gives_the_redis_layer():
    layers = channel_layers_from_url("redis://cache.example:6379/2", POSTGRES)
    assert layers["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    (host,) = layers["default"]["CONFIG"]["hosts"]
    assert host["address"] == "redis://cache.example:6379/2"
    assert host["socket_timeout"] > 5, "longer than channels_redis's 5 s blocking waits"


def test_redis_without_postgres_names_what_to_set():
    with pytest.raises(ValueError, match="DATABASE_URL=postgres://"):
        channel_layers_from_url("redis://127.0.0.1:6379/0", SQLITE)


def test_a_redis_url_that_is_not_redis_is_refused():
    with pytest.raises(ValueError, match="REDIS_URL: unsupported scheme"):
        channel_layers_from_url("http://127.0.0.1:6379", POSTGRES)


def test_front_ends_given_one_secret_key_share_it_and_the_generated_one_is_kept(tmp_path):
    from llamaswap_site.environment import load_or_create_secret_key

    assert load_or_create_secret_key(tmp_path / "secret_key", " shared-key ") == "shared-key"
    assert not (tmp_path / "secret_key").exists(), "a given key is not written into the data dir"
    generated = load_or_create_secret_key(tmp_path / "secret_key", "")
    assert len(generated) > 40 and load_or_create_secret_key(tmp_path / "secret_key") == generated


def test_the_channel_layer_backend_is_chosen_by_a_setting_and_a_wrong_one_is_named():
    assert channel_layers_from_url("redis://r:6379/0", POSTGRES)["default"]["BACKEND"].endswith("core.RedisChannelLayer")
    pubsub = channel_layers_from_url("redis://r:6379/0", POSTGRES, "pubsub")["default"]
    assert pubsub["BACKEND"] == "channels_redis.pubsub.RedisPubSubChannelLayer"
    assert "channel_capacity" not in pubsub["CONFIG"], "the pub/sub layer keeps no messages to bound"
    with pytest.raises(ValueError, match="LLAMASWAP_CHANNEL_LAYER='kafka': use 'lists' or 'pubsub'"):
        channel_layers_from_url("redis://r:6379/0", POSTGRES, "kafka")


def test_a_wrong_variable_is_said_in_one_line_not_a_traceback(tmp_path):
    import os
    import subprocess
    import sys

    from tests.served import REPO

    env = {**os.environ, "LLAMASWAP_DATA_DIR": str(tmp_path), "REDIS_URL": "redis://127.0.0.1:6379/0",
           "DATABASE_URL": "postgres://llamaswap@127.0.0.1:5432/llamaswap", "LLAMASWAP_CHANNEL_LAYER": "bogus"}
    result = subprocess.run([sys.executable, str(REPO / "manage.py"), "check"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == "llamaswap: LLAMASWAP_CHANNEL_LAYER='bogus': use 'lists' or 'pubsub'\n"


def test_the_pubsub_layer_is_prefixed_by_the_redis_database_index_which_pubsub_itself_ignores():
    def prefix(url: str) -> str:
        return channel_layers_from_url(url, POSTGRES, "pubsub")["default"]["CONFIG"]["prefix"]

    assert prefix("redis://r:6379/2") == "llamaswap.db2."
    assert prefix("redis://r:6379") == prefix("redis://r:6379/") == "llamaswap.db0."
    assert prefix("unix:///run/redis.sock?db=5") == "llamaswap.db5."
    assert "prefix" not in channel_layers_from_url("redis://r:6379/2", POSTGRES)["default"]["CONFIG"]
    with pytest.raises(ValueError, match="the database index 'x' in 'redis://r:6379/x' is not a number"):
        channel_layers_from_url("redis://r:6379/x", POSTGRES, "pubsub")
