"""Numbers that parse but could never work: NaN and infinities, and values beyond what the system or a client takes."""

import pytest

MODEL = "models:\n  m:\n    cmd: run --port ${{PORT}}\n{extra}"
PEER = "peers:\n  box:\n    proxy: http://192.168.1.23:8080/\n    models: [a]\n    timeouts: {{{timeouts}}}\n"


@pytest.mark.parametrize(
    "line, key",
    [
        ("captureBuffer: .inf", "captureBuffer"),
        ("captureBuffer: .nan", "captureBuffer"),
        ("globalTTL: .inf", "globalTTL"),
        ("unloadTimeout: .nan", "unloadTimeout"),
        ("healthCheckTimeout: .inf", "healthCheckTimeout"),
    ],
)
def test_top_level_numbers_must_be_finite(config_error, problem, line, key):
    message = problem(config_error(line + "\n" + MODEL.format(extra="")), key)
    assert "must be a finite number — e.g." in message


@pytest.mark.parametrize(
    "entry, key",
    [
        ("ttl: .inf", "ttl"),
        ("ttl: .nan", "ttl"),
        ("unloadTimeout: -.inf", "unloadTimeout"),
        ("timeouts: {connect: .nan}", "timeouts.connect"),
        ("timeouts: {responseHeader: .nan}", "timeouts.responseHeader"),
        ("timeouts: {idleConn: .inf}", "timeouts.idleConn"),
        ("timeouts: {keepalive: .inf}", "timeouts.keepalive"),
        ("timeouts: {tlsHandshake: .nan}", "timeouts.tlsHandshake"),
        ("timeouts: {expectContinue: .inf}", "timeouts.expectContinue"),
    ],
)
def test_model_numbers_must_be_finite(config_error, problem, entry, key):
    error = config_error(MODEL.format(extra=f"    {entry}\n"))
    assert "must be a finite number — e.g." in problem(error, f"models.m.{key}")


@pytest.mark.parametrize("value", ["40000", "32768", "3000000000"])
def test_keepalive_above_the_tcp_limit_is_refused(config_error, problem, value):
    error = config_error(MODEL.format(extra=f"    timeouts: {{keepalive: {value}}}\n"))
    assert problem(error, "models.m.timeouts.keepalive") == f"{value} is above the maximum of 32767 — e.g. keepalive: 30"


def test_a_peers_keepalive_has_the_same_limit(config_error, problem):
    error = config_error(PEER.format(timeouts="keepalive: 40000"))
    assert "above the maximum of 32767" in problem(error, "peers.box.timeouts.keepalive")


def test_the_largest_keepalive_and_huge_other_timeouts_are_taken(load):
    timeouts = load(MODEL.format(
        extra="    timeouts: {keepalive: 32767, connect: 1.0e+300, responseHeader: 1.0e+300, idleConn: 1.0e+300, "
        "tlsHandshake: 1.0e+300}\n"
    )).models["m"].timeouts
    assert timeouts.keepalive == 32767 and timeouts.connect == timeouts.idle_conn == 1e300


def test_context_beyond_what_json_clients_read_exactly_is_refused(config_error, problem, load):
    error = config_error(MODEL.format(extra="    capabilities: {context: 99999999999999999999999}\n"))
    assert problem(error, "models.m.capabilities.context") == (
        "99999999999999999999999 is above the maximum of 9007199254740991 — e.g. context: 32768"
    )
    config = load(MODEL.format(extra="    capabilities: {context: 9007199254740991}\n"))
    assert config.models["m"].capabilities.context == 2**53 - 1


@pytest.mark.parametrize(
    "alias, expected",
    [
        ("''", 'the name is empty — write a name clients can ask for, e.g. "gpt-4o-mini"'),
        ("' '", 'the name is empty — write a name clients can ask for, e.g. "gpt-4o-mini"'),
        ("' fast'", '" fast" has spaces around it, and requests strip them — write "fast"'),
        ("'sh own '", '"sh own " has spaces around it, and requests strip them — write "sh own"'),
    ],
)
def test_an_alias_no_request_could_reach_is_refused(config_error, problem, alias, expected):
    error = config_error(MODEL.format(extra=f"    aliases: [ok, {alias}]\n"))
    assert problem(error, "models.m.aliases[1]") == expected


def test_aliases_with_inner_spaces_and_slashes_are_names(load):
    config = load(MODEL.format(extra="    aliases: ['org/model', 'my model', '../x']\n"))
    assert config.models["m"].aliases == ("org/model", "my model", "../x")


@pytest.mark.parametrize(
    "name, key, expected",
    [
        ("''", "models.m.filters.setParamsByID.", "the name is empty"),
        ("' m:high'", "models.m.filters.setParamsByID. m:high", '" m:high" has spaces around it, and requests strip them — write "m:high"'),
    ],
)
def test_a_set_params_by_id_name_no_request_could_reach_is_refused(config_error, problem, name, key, expected):
    error = config_error(MODEL.format(extra=f"    filters: {{setParamsByID: {{{name}: {{temperature: 1}}}}}}\n"))
    assert expected in problem(error, key)


@pytest.mark.parametrize("value, shown", [("1", "the number 1"), ("[proxy]", "a list")])
def test_a_log_destination_that_is_not_text_is_one_problem(config_error, problem, value, shown):
    error = config_error(f"logToStdout: {value}\n" + MODEL.format(extra=""))
    message = problem(error, "logToStdout")  # one problem, not a second about ""
    assert message.startswith("expected text, got ") and 'use one of "proxy", "upstream", "both", "none"' in message


def test_null_log_keys_mean_the_default(load):
    output = load("logToStdout: null\nlogTimeFormat: ~\n" + MODEL.format(extra="")).log_output
    assert output.to_stdout is None and output.time_format is None


def test_a_proxy_url_that_cannot_be_reached_is_refused_naming_why(config_error, problem):
    urls = {
        "bracket": ("http://[::1", "Invalid IPv6 URL"),
        "nohost": ("http://[zz]:1", "does not appear to be an IPv4 or IPv6 address"),
        "range": ("http://127.0.0.1:99999", "Port out of range"),
        "word": ("http://127.0.0.1:abc", "could not be cast"),
        "space": ("http://127.0.0.1:1/a b", "whitespace"),
        "zero": ("http://127.0.0.1:0", "port 0"),
    }
    models = "".join(f'  {name}:\n    cmd: run\n    proxy: "{url}"\n' for name, (url, _) in urls.items())
    peers = "".join(f'  p-{name}:\n    proxy: "{url}"\n    models: [x]\n' for name, (url, _) in urls.items())
    error = config_error("models:\n" + models + "peers:\n" + peers)
    for name, (url, why) in urls.items():
        for key in (f"models.{name}.proxy", f"peers.p-{name}.proxy"):
            message = problem(error, key)
            assert url in message and why in message and "e.g. proxy:" in message, (key, message)


def test_exponents_are_numbers_as_in_yaml_1_2(load):
    config = load("""
        globalTTL: 1e3
        captureBuffer: 2.5E-1
        models:
          m:
            cmd: run
            proxy: http://127.0.0.1:8080
            timeouts: {connect: 1.0e2}
            metadata: {note: "1e3", plain: 1e3}
    """)
    assert (config.global_ttl, config.capture_buffer_mb) == (1000, 0.25)
    model = config.models["m"]
    assert model.timeouts.connect == 100
    assert model.metadata["note"] == "1e3" and model.metadata["plain"] == 1000.0  # quoted text stays text


ROUTING = "routing:\n  scheduler:\n    use: {use}\n    settings:\n      {use}: {{{settings}}}\n"


def scheduler(use: str, settings: str) -> str:
    return MODEL.format(extra="") + ROUTING.format(use=use, settings=settings)


@pytest.mark.parametrize("use, settings, key, expected", [
    ("serial", "slots: {m: 1025}", "routing.scheduler.settings.serial.slots.m", "1025 is above the maximum of 1024"),
    ("serial", f"slots: {{m: {2**64}}}", "routing.scheduler.settings.serial.slots.m",
     f"{2**64} is above the maximum of 1024"),
    ("fifo", "priority: {m: 1000000001}", "routing.scheduler.settings.fifo.priority.m",
     "1000000001 is above the maximum of 1000000000"),
    ("fifo", "priority: {m: -1000000001}", "routing.scheduler.settings.fifo.priority.m",
     "-1000000001 is below the minimum of -1000000000"),
])
def test_scheduler_numbers_past_their_bounds_are_refused_naming_the_key(config_error, problem, use, settings, key,
                                                                         expected):
    assert problem(config_error(scheduler(use, settings)), key).startswith(expected + " — e.g. m:")


def test_scheduler_numbers_at_their_bounds_are_taken(load):
    assert dict(load(scheduler("serial", "slots: {m: 1024}")).scheduler.serial.slots) == {"m": 1024}
    for bound in (10**9, -(10**9)):
        config = load(scheduler("fifo", f"priority: {{m: {bound}}}"))
        assert dict(config.scheduler.fifo_priority) == {"m": bound}


@pytest.mark.parametrize("line, key", [
    (f"    concurrencyLimit: {2**53}\n", "models.m.concurrencyLimit"),
    (f"    capabilities: {{context: {2**64}}}\n", "models.m.capabilities.context"),
])
def test_every_whole_number_stops_where_json_clients_read_it_exactly(config_error, problem, line, key):
    message = problem(config_error(MODEL.format(extra=line)), key)
    assert "is above the maximum of 9007199254740991" in message, message
