"""Identifiers shared by the rollout server and gateway nodes."""

from __future__ import annotations

import secrets


def new_session_id() -> str:
    """192 random bits, URL- and header-safe: the session id doubles as the harness's API key."""
    return "ps-" + secrets.token_urlsafe(24)
