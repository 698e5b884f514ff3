"""Small string helpers."""

import re

_NON_WORD = re.compile(r"[^a-z0-9]+")


def slugify(text, sep="-"):
    """Lowercase ``text`` and join its words with ``sep``."""
    return _NON_WORD.sub(sep, text.lower()).strip(sep)


def word_count(text):
    """The number of whitespace-separated words in ``text``."""
    return len(text.split())


def truncate(text, width, suffix="..."):
    """Shorten ``text`` to at most ``width`` characters, ending with ``suffix`` when cut."""
    if len(text) <= width:
        return text
    return text[:width] + suffix
