"""Secrets kept in files: a server's admin token, a node's credential.

A server started without a configured token makes one at first start and keeps it in its state
directory, readable by its owner only (0600); a restart reads the same file, so clients that
read it once keep working. Nothing here talks HTTP: :mod:`polar.auth` checks what callers send.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import secrets
from pathlib import Path

from polar.errors import ConfigError

GATEWAY_TOKEN_FILE = "gateway.token"
ROLLOUT_TOKEN_FILE = "rollout.token"
NODE_CREDENTIAL_FILE = "node.credential"

log = logging.getLogger("polar.auth")


def new_token() -> str:
    """A fresh random secret: 256 bits as hex, so it is URL-safe and never starts with ``-``
    (``--token -x…`` would read as a missing value to every argument parser)."""
    return secrets.token_hex(32)


def read_token(path: Path) -> str | None:
    """The secret kept in ``path``; None when there is no such file (or it is empty)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def write_token(path: Path, token: str) -> None:
    """Keep ``token`` in ``path``, 0600 from the first byte (never world-readable, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    partial.replace(path)


def token_from_file(path: Path) -> str:
    """The token kept in ``path``, made (and written 0600) if there is none yet."""
    token = read_token(path)
    if token is None:
        token = new_token()
        write_token(path, token)
    return token


def digest(token: str) -> str:
    """What a server stores of a credential it issued (credentials are random: no salt needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_auth_off_loopback(host: str, *, auth: bool, what: str, how: str) -> None:
    """Auth may be turned off for experiments on loopback only: raise a ConfigError naming
    ``how`` to set a token when ``host`` is reachable from other machines."""
    if not auth and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve the {what} on {host} without auth: anyone who reaches this "
            f"address could drive it. Remove the auth opt-out (--no-auth / auth: false); "
            f"{how}"
        )


def admin_token(
    *, host: str, auth: bool, configured: str | None, token_file: Path, what: str, how: str
) -> str | None:
    """A server's admin token: the configured one, else the one kept in ``token_file`` (made at
    first start); None when auth is turned off, which only a loopback ``host`` may do."""
    require_auth_off_loopback(host, auth=auth, what=what, how=how)
    if not auth:
        log.warning("%s auth is OFF (auth: false): any local process may drive it", what)
        return None
    if configured:
        return configured
    token = token_from_file(token_file)
    log.info("%s admin token: %s", what, token_file)
    return token
