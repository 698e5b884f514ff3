import pytest
from shopcart import Cart


def test_add_and_quantity():
    cart = Cart()
    cart.add("pen", unit_cents=150, quantity=2)
    cart.add("pen", unit_cents=150)
    assert cart.quantity("pen") == 3
    assert cart.total() == 450


def test_remove():
    cart = Cart()
    cart.add("pen", unit_cents=150, quantity=3)
    cart.remove("pen", 2)
    assert cart.quantity("pen") == 1
    cart.remove("pen")
    assert cart.quantity("pen") == 0
    with pytest.raises(KeyError):
        cart.remove("pen")


def test_no_discount_below_bulk_quantity():
    cart = Cart()
    cart.add("mug", unit_cents=200, quantity=9)
    assert cart.total() == 1800


def test_bulk_discount_above_bulk_quantity():
    cart = Cart()
    cart.add("mug", unit_cents=200, quantity=12)
    assert cart.total() == 2160
