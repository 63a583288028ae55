"""`llamaswap serve`'s llama-swap options with real processes: --config-dir (merged, watched, duplicates
refused naming both files), HTTPS with --tls-cert-file/--tls-key-file, and --version."""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import ssl
import subprocess
import sys
import textwrap

import httpx
import pytest

from proxy.version import llamaswap_version
from tests.served import REPO, Served, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e


def model(name: str) -> str:
    return textwrap.indent(textwrap.dedent(f"""\
        {name}:
          cmd: {fake_cmd(name, None, "--tps", "0", "--tokens", "2")}
          proxy: http://127.0.0.1:${{PORT}}
        """), "  ")


def chat(base: str, name: str, **client) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=60, **client,
                      json={"model": name, "messages": [{"role": "user", "content": "hi"}]})


def listed(base: str) -> set[str]:
    return {entry["id"] for entry in httpx.get(base + "/v1/models", timeout=10).json()["data"]}


def run_serve(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """`llamaswap serve` expected to exit at once."""
    env = {**os.environ, "LLAMASWAP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(REPO / "manage.py"), "serve", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


# -- --config-dir -----------------------------------------------------------------------------------


def test_config_dir_files_are_merged_after_config_and_watched(tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "20-beta.yaml").write_text(f"models:\n{model('beta')}")
    (conf_d / "notes.txt").write_text("models: {not: read}\n")
    config = f"healthCheckTimeout: 20\nstartPort: {model_ports(6)}\nmodels:\n{model('alpha')}"
    with Served(tmp_path, config, extra_args=("--config-dir", str(conf_d), "--watch-config")) as served:
        assert listed(served.base) == {"alpha", "beta"}
        assert chat(served.base, "beta").status_code == 200
        (conf_d / "10-gamma.yml").write_text(f"models:\n{model('gamma')}")
        wait_until(lambda: "gamma" in listed(served.base), 20, 0.2, "a file added to --config-dir to be loaded")
        assert chat(served.base, "gamma").status_code == 200
        (conf_d / "20-beta.yaml").unlink()
        wait_until(lambda: listed(served.base) == {"alpha", "gamma"}, 20, 0.2, "a removed file's model to go")
        (conf_d / "30-bad.yaml").write_text("logLevel: loud\n")
        wait_until(lambda: "30-bad.yaml: logLevel" in served.log(), 20, 0.2, "the bad file to be named")
        assert listed(served.base) == {"alpha", "gamma"}, "a bad file leaves the running config alone"


def test_config_dir_alone_is_enough_and_sighup_rereads_it(tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "a.yaml").write_text(f"startPort: {model_ports(2)}\nhealthCheckTimeout: 20\n")
    (conf_d / "b.yaml").write_text(f"models:\n{model('only')}")
    port = model_ports(1)
    env = {**os.environ, "LLAMASWAP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "serve", "--config-dir", str(conf_d), "--listen", f"127.0.0.1:{port}"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        def healthy():
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return httpx.get(base + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 30, 0.05, "llamaswap to answer /health")
        assert listed(base) == {"only"} and chat(base, "only").status_code == 200
        (conf_d / "c.yaml").write_text(f"models:\n{model('added')}")
        proc.send_signal(signal.SIGHUP)  # no --watch-config: SIGHUP re-reads the directory
        wait_until(lambda: listed(base) == {"only", "added"}, 20, 0.1, "SIGHUP to load the added file")
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_model_defined_in_two_files_exits_2_naming_both(tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"models:\n{model('alpha')}")
    (conf_d / "extra.yaml").write_text(f"models:\n{model('alpha')}")
    result = run_serve(tmp_path, "--config", str(config), "--config-dir", str(conf_d))
    assert result.returncode == 2
    assert (
        f"{conf_d / 'extra.yaml'}: models.alpha: defined in both {config} and {conf_d / 'extra.yaml'}"
        in result.stderr
    ), result.stderr


def test_two_values_for_one_setting_are_refused_and_a_null_gives_way(tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "a.yaml").write_text(f"logLevel: debug\nglobalTTL: ~\nmodels:\n{model('alpha')}")
    (conf_d / "b.yaml").write_text("logLevel: ~\nglobalTTL: 300\n")
    result = run_serve(tmp_path, "--config-dir", str(conf_d), "--check")
    assert result.returncode == 0, result.stderr
    assert "globalTTL 300s" in result.stdout
    (conf_d / "c.yaml").write_text("logLevel: warn\n")
    result = run_serve(tmp_path, "--config-dir", str(conf_d), "--check")
    assert result.returncode == 2
    assert f"logLevel: {conf_d / 'a.yaml'} sets debug and {conf_d / 'c.yaml'} sets warn — set it in one file only" in result.stderr


def test_check_of_a_config_with_problems_prints_its_warnings_too(tmp_path):
    """`--check` prints every problem and every warning: a file that does not load still says what it ignores
    (llama-swap's own example config has both), in a file or a --config-dir."""
    config = tmp_path / "config.yaml"
    config.write_text(f"ui: {{}}\nreadyTimeout: 30\nmodels:\n{model('alpha')}    ttl: -5\n")
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "a.yaml").write_text(config.read_text())
    for given in (("--config", str(config)), ("--config-dir", str(conf_d))):
        result = run_serve(tmp_path, *given, "--check")
        assert result.returncode == 2, result.stderr
        where = config if given[0] == "--config" else conf_d / "a.yaml"
        for expected in (f"{where}: models.alpha.ttl: -5 is negative", f"warning: {where}: ui: ignored",
                         f"warning: {where}: readyTimeout: unknown key, ignored — did you mean healthCheckTimeout?"):
            assert expected in result.stderr, (given, result.stderr)


def test_serve_needs_a_config_or_a_config_dir(tmp_path):
    result = run_serve(tmp_path)
    assert result.returncode == 2 and "pass --config FILE, --config-dir DIR, or both" in result.stderr
    result = run_serve(tmp_path, "--config-dir", str(tmp_path / "missing"))
    assert result.returncode == 2 and f"{tmp_path / 'missing'}: not a directory" in result.stderr


# -- TLS ---------------------------------------------------------------------------------------------


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and localhost, and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class ServedTLS(Served):
    """`llamaswap serve` over HTTPS; the test process trusts its self-signed certificate."""

    def __init__(self, tmp_path, config_text: str, cert: str, key: str):
        super().__init__(tmp_path, config_text, extra_args=("--tls-cert-file", cert, "--tls-key-file", key))
        self.base = self.base.replace("http://", "https://")


def test_https_with_a_self_signed_certificate(tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # Served polls /health with httpx, which then trusts it
    config = f"healthCheckTimeout: 20\nmodels:\n{model('alpha')}"
    with ServedTLS(tmp_path, config, cert, key) as served:
        trusted = ssl.create_default_context(cafile=cert)
        assert httpx.get(served.base + "/health", verify=trusted, timeout=10).status_code == 200
        reply = chat(served.base, "alpha", verify=trusted)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on the TLS port
            httpx.get(served.base.replace("https://", "http://") + "/health", timeout=5).raise_for_status()
        assert f"llamaswap serving on https://127.0.0.1:{served.port}" in served.log()


def test_a_certificate_without_its_key_exits_2(tmp_path):
    cert, key = self_signed(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(f"models:\n{model('alpha')}")
    result = run_serve(tmp_path, "--config", str(config), "--tls-cert-file", cert)
    assert result.returncode == 2
    assert "--tls-cert-file needs --tls-key-file too" in result.stderr
    result = run_serve(tmp_path, "--config", str(config), "--tls-cert-file", cert, "--tls-key-file", cert)
    assert result.returncode == 2 and "not a PEM certificate and its private key" in result.stderr


def test_check_refuses_numbers_that_could_never_work(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"captureBuffer: .nan\nperformance: {{every: 99999999h}}\nmodels:\n{model('alpha')}"
                      "    timeouts: {keepalive: 40000, idleConn: .inf}\n")
    result = run_serve(tmp_path, "--config", str(config), "--check")
    assert result.returncode == 2, result.stderr
    for expected in ("captureBuffer: nan must be a finite number", "performance.every: 99999999h is above the maximum of 24h",
                     "models.alpha.timeouts.keepalive: 40000 is above the maximum of 32767",
                     "models.alpha.timeouts.idleConn: inf must be a finite number"):
        assert expected in result.stderr


def test_an_encrypted_key_exits_2_with_one_line_and_never_asks_for_its_pass_phrase(tmp_path):
    from cryptography.hazmat.primitives import serialization

    cert, key = self_signed(tmp_path)
    encrypted = tmp_path / "encrypted.pem"
    private = serialization.load_pem_private_key(open(key, "rb").read(), password=None)
    encrypted.write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    config = tmp_path / "config.yaml"
    config.write_text(f"models:\n{model('alpha')}")
    result = run_serve(tmp_path, "--config", str(config), "--tls-cert-file", cert, "--tls-key-file", str(encrypted))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the private key is encrypted" in lines[0] and "openssl pkey -in" in lines[0], lines


@pytest.mark.parametrize("which", ["--tls-cert-file", "--tls-key-file"])
def test_a_directory_as_a_tls_file_exits_2_with_one_line(tmp_path, which):
    cert, key = self_signed(tmp_path)
    files = {"--tls-cert-file": cert, "--tls-key-file": key, which: str(tmp_path)}
    config = tmp_path / "config.yaml"
    config.write_text(f"models:\n{model('alpha')}")
    result = run_serve(tmp_path, "--config", str(config), *(part for pair in files.items() for part in pair))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{which} {tmp_path}: not a readable file" in lines[0], lines


def test_version(tmp_path):
    for args in (["serve", "--version"], ["--version"]):
        result = subprocess.run([sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, capture_output=True,
                                text=True, timeout=60, env={**os.environ, "LLAMASWAP_DATA_DIR": str(tmp_path)})
        assert result.returncode == 0 and result.stdout.strip() == f"llamaswap {llamaswap_version()}", result
