import pytest
from ledger import format_cents, split_evenly, to_cents


def test_to_cents():
    assert to_cents("12.50") == 1250
    assert to_cents("12.5") == 1250
    assert to_cents("7") == 700


def test_format_cents():
    assert format_cents(1250) == "$12.50"
    assert format_cents(-5) == "-$0.05"


def test_split_evenly_exact():
    assert split_evenly(900, 3) == [300, 300, 300]


def test_split_evenly_rejects_zero_parts():
    with pytest.raises(ValueError):
        split_evenly(100, 0)
