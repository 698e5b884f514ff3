"""A shopping cart with a bulk discount."""

from shopcart.cart import BULK_DISCOUNT_PERCENT, BULK_QUANTITY, Cart

__all__ = ["BULK_DISCOUNT_PERCENT", "BULK_QUANTITY", "Cart"]
