"""``--web.config.file``: TLS, basic auth and response headers, in the Prometheus
exporter-toolkit's web configuration format.

The format is exporter-toolkit's (docs/web-configuration.md in prometheus/exporter-toolkit), so
a file written for node_exporter or Prometheus works here. What Python's ``ssl`` module cannot
do is refused at start-up with one line that names the key, never ignored: a file that asks for
a protection the exporter does not give must not start an exporter without it. Unknown keys are
refused too, as exporter-toolkit refuses them.

This module parses and validates; http.py applies the result. Relative file names are relative
to the web configuration file's folder (exporter-toolkit's rule). The file and the certificates
are read once, at start-up: a restart applies a change.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
import ssl
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

# exporter-toolkit's client_auth_type values that Python's ssl can enforce. RequestClientCert and
# RequireAnyClientCert ask for a certificate without verifying it, which ssl cannot do (it
# verifies every certificate it asks for); they are refused by name below.
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_CLIENT_AUTH_UNSUPPORTED = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                 "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

# Go's cipher suite names (the ones crypto/tls.CipherSuites() lists, which exporter-toolkit
# accepts) and OpenSSL's names for them. TLS 1.3 suites are refused: neither Go nor Python's ssl
# lets a server choose them.
_CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
_TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")

# exporter-toolkit's response headers and, where the value is an enumeration, its values.
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (), "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": (), "Content-Security-Policy": (),
}

# Every key of the format, with what happens to it here: None = supported, else why it is not.
_TOP_KEYS: dict[str, str | None] = {
    "tls_server_config": None, "http_server_config": None, "basic_auth_users": None,
    "rate_limit": "is not supported; put a reverse proxy in front to rate-limit",
}
_TLS_KEYS: dict[str, str | None] = {
    "cert_file": None, "key_file": None, "client_auth_type": None, "client_ca_file": None,
    "client_ca": None, "client_allowed_sans": None, "min_version": None, "max_version": None,
    "cipher_suites": None, "prefer_server_cipher_suites": None,
    "cert": "(an inline certificate) is not supported; use cert_file",
    "key": "(an inline key) is not supported; use key_file",
    "curve_preferences": "is not supported: Python's ssl module cannot order the key-exchange "
                         "groups; remove it",
}
_HTTP_KEYS: dict[str, str | None] = {"headers": None, "http2": None}

_BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")
# bcrypt reads at most 72 bytes of a password; the bcrypt package refuses longer ones instead
# of truncating, which htpasswd and Go do: truncate, so that the same hash accepts the same
# password here and there.
_BCRYPT_MAX_PASSWORD = 72
# Compared against when the user is unknown, so that an unknown user costs a bcrypt like a
# known one: the answer's timing does not tell which user names exist (exporter-toolkit's decoy).
_DECOY_HASH = b"$2b$10$JjTP3yrXuRPQKU14m75WVeRw.YFuMGSTgNb7H6QZC1eBxl1eEWWLK"


class WebConfigError(ValueError):
    """The web configuration file cannot be used; the message is one line."""


@dataclass(frozen=True)
class WebConfig:
    path: Path
    # None: plain HTTP (the file has no tls_server_config, or an empty one).
    tls: ssl.SSLContext | None = None
    # Subject alternative names one of which a client certificate must carry; empty: any.
    client_allowed_sans: frozenset[str] = frozenset()
    headers: Mapping[str, str] = field(default_factory=dict)
    # user -> bcrypt hash; empty: no basic auth.
    users: Mapping[str, bytes] = field(default_factory=dict)


def load_web_config(path: Path) -> WebConfig:
    """Read, validate and apply ``path``; WebConfigError (one line) for anything unusable."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not YAML: {_one_line(str(exc))}") from None
    try:
        return _build(path, {} if doc is None else doc)
    except WebConfigError as exc:
        raise WebConfigError(f"{path}: {exc}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(section: dict[str, Any], known: dict[str, str | None], where: str) -> None:
    for key in section:
        if key not in known:
            raise WebConfigError(f"{where}{key}: unknown key (known: {', '.join(known)})")
        reason = known[key]
        if reason is not None:
            raise WebConfigError(f"{where}{key} {reason}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise WebConfigError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise WebConfigError(f"{where}: expected a list of strings")
    return [_string(v, where) for v in value]


def _build(path: Path, doc: Any) -> WebConfig:
    top = _mapping(doc, "the file")
    _check_keys(top, _TOP_KEYS, "")
    headers = _headers(_mapping(top.get("http_server_config"), "http_server_config"))
    users = _users(_mapping(top.get("basic_auth_users"), "basic_auth_users"))
    tls_section = _mapping(top.get("tls_server_config"), "tls_server_config")
    _check_keys(tls_section, _TLS_KEYS, "tls_server_config.")
    tls, sans = _tls(path.parent, tls_section) if tls_section else (None, frozenset[str]())
    return WebConfig(path=path, tls=tls, client_allowed_sans=sans, headers=headers, users=users)


def _headers(section: dict[str, Any]) -> dict[str, str]:
    _check_keys(section, _HTTP_KEYS, "http_server_config.")
    if section.get("http2", False) is not False:
        raise WebConfigError("http_server_config.http2: the exporter serves HTTP/1.1 only; "
                             "remove http2 or set it to false")
    out = {}
    for name, value in _mapping(section.get("headers"), "http_server_config.headers").items():
        where = f"http_server_config.headers.{name}"
        if name not in HEADERS:
            raise WebConfigError(f"{where}: this header cannot be configured "
                                 f"(allowed: {', '.join(HEADERS)})")
        value = _string(value, where)
        if HEADERS[name] and value not in HEADERS[name]:
            raise WebConfigError(f"{where}: {value!r} is not one of {', '.join(HEADERS[name])}")
        if "\r" in value or "\n" in value:
            raise WebConfigError(f"{where}: a header value is one line")
        if value:  # blank: unset, as exporter-toolkit says
            out[name] = value
    return out


def _users(section: dict[str, Any]) -> dict[str, bytes]:
    users = {}
    for user, hashed in section.items():
        where = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{where}: a user name is a non-empty string without ':'")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise WebConfigError(f"{where}: not a bcrypt hash (make one with "
                                 "`htpasswd -nBC 10 \"\" | tr -d ':\\n'`)")
        users[user] = hashed.encode()
    return users


def _file(base: Path, value: Any, where: str) -> Path:
    p = Path(_string(value, where))
    p = p if p.is_absolute() else base / p
    if not p.is_file():
        raise WebConfigError(f"{where}: {p}: no such file")
    return p


def _tls(base: Path, section: dict[str, Any]) -> tuple[ssl.SSLContext, frozenset[str]]:
    where = "tls_server_config."
    if not section.get("cert_file"):
        raise WebConfigError(f"{where}cert_file: missing (the server's certificate)")
    if not section.get("key_file"):
        raise WebConfigError(f"{where}key_file: missing (the server's private key)")
    cert = _file(base, section["cert_file"], where + "cert_file")
    key = _file(base, section["key_file"], where + "key_file")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = _string(section.get(name, default), where + name)
        if value not in _TLS_VERSIONS:
            raise WebConfigError(f"{where}{name}: {value!r} is not one of {', '.join(_TLS_VERSIONS)}")
        versions[name] = _TLS_VERSIONS[value]
    if versions["min_version"] > versions["max_version"]:
        raise WebConfigError(f"{where}min_version is above max_version")
    try:
        ctx.minimum_version = versions["min_version"]
        ctx.maximum_version = versions["max_version"]
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise WebConfigError(f"{where}cert_file/key_file: cannot use {cert} with {key}: "
                             f"{_one_line(str(exc))}") from None
    # Only HTTP/1.1 is served: say so in ALPN, so that no client tries HTTP/2.
    ctx.set_alpn_protocols(["http/1.1"])

    suites = _strings(section.get("cipher_suites"), where + "cipher_suites")
    if suites:
        _set_ciphers(ctx, suites, where + "cipher_suites")
    prefer = section.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise WebConfigError(f"{where}prefer_server_cipher_suites: expected true or false")
    if prefer:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE

    auth_type = _string(section.get("client_auth_type") or "NoClientCert", where + "client_auth_type")
    if auth_type in _CLIENT_AUTH_UNSUPPORTED:
        raise WebConfigError(f"{where}client_auth_type: {auth_type} (a client certificate taken "
                             "without verifying it) is not supported; use RequireAndVerifyClientCert")
    if auth_type not in _CLIENT_AUTH:
        raise WebConfigError(f"{where}client_auth_type: {auth_type!r} is not one of "
                             f"{', '.join([*_CLIENT_AUTH, *_CLIENT_AUTH_UNSUPPORTED])}")
    ca_file = section.get("client_ca_file")
    ca_text = section.get("client_ca")
    if ca_file and ca_text:
        raise WebConfigError(f"{where}client_ca_file and client_ca: give one of them")
    has_ca = bool(ca_file or ca_text)
    if has_ca and auth_type == "NoClientCert":
        raise WebConfigError(f"{where}client_ca_file (or client_ca) is set but client_auth_type "
                             "is NoClientCert; set client_auth_type: RequireAndVerifyClientCert")
    if not has_ca and auth_type != "NoClientCert":
        raise WebConfigError(f"{where}client_auth_type {auth_type} needs client_ca_file (the CA "
                             "that issued the clients' certificates)")
    ctx.verify_mode = _CLIENT_AUTH[auth_type]
    try:
        if ca_file:
            ctx.load_verify_locations(cafile=_file(base, ca_file, where + "client_ca_file"))
        elif ca_text:
            ctx.load_verify_locations(cadata=_string(ca_text, where + "client_ca"))
    except (ssl.SSLError, ValueError) as exc:
        raise WebConfigError(f"{where}client_ca_file: not a PEM CA certificate: "
                             f"{_one_line(str(exc))}") from None

    sans = _strings(section.get("client_allowed_sans"), where + "client_allowed_sans")
    if sans and auth_type != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{where}client_allowed_sans needs client_auth_type: "
                             "RequireAndVerifyClientCert")
    return ctx, frozenset(_normal_san(s) for s in sans)


def _set_ciphers(ctx: ssl.SSLContext, suites: list[str], where: str) -> None:
    names = []
    for suite in suites:
        if suite in _TLS13_SUITES:
            raise WebConfigError(f"{where}: {suite} is a TLS 1.3 suite, which a server cannot "
                                 "choose (TLS 1.3 always offers its own); list TLS 1.2 suites only")
        if suite not in _CIPHER_SUITES:
            raise WebConfigError(f"{where}: unknown cipher suite {suite!r} (Go's names, e.g. "
                                 "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
        names.append(_CIPHER_SUITES[suite])
    try:
        ctx.set_ciphers(":".join(names))
    except ssl.SSLError:
        raise WebConfigError(f"{where}: none of them is available in this OpenSSL") from None
    # OpenSSL skips the names it does not know: check that each one made it.
    enabled = {c["name"] for c in ctx.get_ciphers()}
    missing = [s for s, n in zip(suites, names) if n not in enabled]
    if missing:
        raise WebConfigError(f"{where}: {', '.join(missing)} not available in this OpenSSL")


def _normal_san(value: str) -> str:
    """One spelling per address: Go prints IPv6 compressed, Python's ssl in full."""
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return value


def peer_sans(cert: Mapping[str, Any]) -> set[str]:
    """The subject alternative names (DNS, IP, e-mail, URI) of a verified peer certificate, as
    ``SSLSocket.getpeercert()`` returns it."""
    return {_normal_san(v) for kind, v in cert.get("subjectAltName", ())
            if kind in ("DNS", "IP Address", "email", "URI")}


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes.

    bcrypt costs ~100 ms by design and Prometheus scrapes every few seconds, so a successful
    check is remembered (as exporter-toolkit does): the next scrape with the same credentials
    costs a hash lookup. Failures are not remembered, so that a flood of wrong passwords cannot
    push the good ones out; bcrypt runs one at a time, so that such a flood costs one core at
    most, and a cached scrape never waits for it. The cache keys are SHA-256 digests: no
    password is kept in memory.
    """

    CACHE_SIZE = 64

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self.users = dict(users)
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()
        self.bcrypt_checks = 0  # how many times bcrypt ran (the cache's effect, for tests)

    def check(self, authorization: str | None) -> bool:
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"", password))).digest()
        with self._cache_lock:
            if hashed is not None and key in self._ok:
                self._ok.move_to_end(key)
                return True
        with self._bcrypt_lock:
            self.bcrypt_checks += 1
            try:
                ok = bcrypt.checkpw(password[:_BCRYPT_MAX_PASSWORD], hashed or _DECOY_HASH)
            except ValueError:  # a hash bcrypt cannot read: no password matches it
                ok = False
        if not (ok and hashed is not None):
            return False
        with self._cache_lock:
            self._ok[key] = None
            while len(self._ok) > self.CACHE_SIZE:
                self._ok.popitem(last=False)
        return True


def _basic_credentials(authorization: str | None) -> tuple[str, bytes] | None:
    scheme, _, encoded = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(encoded.strip(), validate=True)
        user, sep, password = raw.partition(b":")
        return (user.decode(), password) if sep else None
    except (binascii.Error, UnicodeDecodeError):
        return None
