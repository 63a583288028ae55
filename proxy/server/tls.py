"""`llamaswap serve --tls-cert-file/--tls-key-file`: HTTPS served by daphne itself, as llama-swap serves it.

Twisted's `ssl:` endpoint does the TLS (pyOpenSSL and service_identity come with daphne's
`twisted[tls]`). The pair is checked before anything starts, so a wrong path or a key that
does not match the certificate is one clear line, not a traceback from the reactor.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass


class TLSFilesError(ValueError):
    """The TLS options cannot be used; the message says which and what to do."""


@dataclass(frozen=True)
class TLSFiles:
    cert: str
    key: str


def tls_files(cert: str | None, key: str | None) -> TLSFiles | None:
    """The checked pair, None for plain HTTP; both options or neither."""
    if not cert and not key:
        return None
    if not cert or not key:
        given, missing = ("--tls-cert-file", "--tls-key-file") if cert else ("--tls-key-file", "--tls-cert-file")
        raise TLSFilesError(f"{given} needs {missing} too: pass both to serve HTTPS, or neither for HTTP")
    cert, key = os.path.abspath(cert), os.path.abspath(key)
    for option, path in (("--tls-cert-file", cert), ("--tls-key-file", key)):
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise TLSFilesError(f"{option} {path}: not a readable file")
    try:
        # The callback answers OpenSSL's pass phrase request, which would otherwise prompt on the terminal
        # and block; refusing here also means Twisted, which loads the key without one, never meets it.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_refuse_pass_phrase)
    except _EncryptedKey:
        raise TLSFilesError(
            f"--tls-key-file {key}: the private key is encrypted (it needs a pass phrase) — give an unencrypted key, "
            f"e.g. openssl pkey -in {key} -out key-plain.pem"
        ) from None
    except ssl.SSLError as exc:
        raise TLSFilesError(
            f"--tls-cert-file {cert} / --tls-key-file {key}: not a PEM certificate and its private key ({exc.reason or exc})"
        ) from None
    except OSError as exc:  # removed or made unreadable since the check above
        raise TLSFilesError(f"--tls-cert-file {cert} / --tls-key-file {key}: {exc.strerror or exc}") from None
    return TLSFiles(cert, key)


class _EncryptedKey(Exception):
    """OpenSSL asked for the key's pass phrase."""


def _refuse_pass_phrase() -> bytes:
    raise _EncryptedKey


def _escaped(value: str) -> str:
    """A value inside a Twisted endpoint description, where ':' separates arguments."""
    return value.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


def listen_endpoint(host: str, port: int, tls: TLSFiles | None, backlog: int) -> str:
    """daphne's endpoint description for `--listen` (with TLS when `tls` is set)."""
    kind = "tcp" if tls is None else "ssl"
    description = f"{kind}:port={port}:interface={_escaped(host)}:backlog={backlog}"
    if tls is not None:
        description += f":privateKey={_escaped(tls.key)}:certKey={_escaped(tls.cert)}"
    return description
