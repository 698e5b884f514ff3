"""Money in integer cents."""

from ledger.money import format_cents, split_evenly, to_cents

__all__ = ["format_cents", "split_evenly", "to_cents"]
