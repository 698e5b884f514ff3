"""Small string helpers."""

from textkit.strings import slugify, truncate, word_count

__all__ = ["slugify", "truncate", "word_count"]
