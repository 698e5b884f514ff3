"""Scraping a live server's /metrics in tests: prometheus-client's own parser, one value per
sample name and label set."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, token: str | None) -> Samples:
    """Every sample ``url``/metrics exposes now."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    reply = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return parse(reply.text)


def parse(text: str) -> Samples:
    """Every sample in ``text`` (the exposition format)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; 0 when the server has none (yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of every ``name`` sample whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


def scrape_until(
    url: str, token: str | None, ready: Callable[[Samples], bool], timeout_s: float = 10.0
) -> Samples:
    """Scrape until ``ready`` holds (what a server counts after it answered), or fail."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url, token)
        if ready(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never got there; last scrape: {samples}")
        time.sleep(0.05)
