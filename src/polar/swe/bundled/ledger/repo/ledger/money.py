"""Money in integer cents, so sums never drift the way floats do."""


def to_cents(amount):
    """``"12.5"`` or ``"12.50"`` -> ``1250``."""
    whole, _, fraction = amount.strip().partition(".")
    if len(fraction) > 2:
        raise ValueError("more than two decimal places: " + amount)
    return int(whole or "0") * 100 + int(fraction.ljust(2, "0") or "0")


def format_cents(cents):
    """``1250`` -> ``"$12.50"``."""
    sign = "-" if cents < 0 else ""
    return f"{sign}${abs(cents) // 100}.{abs(cents) % 100:02d}"


def split_evenly(total_cents, parts):
    """Split ``total_cents`` into ``parts`` shares that differ by at most one cent and add up
    to the total."""
    if parts <= 0:
        raise ValueError("parts must be positive")
    share = total_cents // parts
    return [share] * parts
