"""A shopping cart: lines of (unit price in cents, quantity) per item."""

# A line of BULK_QUANTITY or more of the same item gets BULK_DISCOUNT_PERCENT off.
BULK_QUANTITY = 10
BULK_DISCOUNT_PERCENT = 10


class Cart:
    def __init__(self):
        self._lines = {}

    def add(self, sku, unit_cents, quantity=1):
        """Add ``quantity`` of ``sku`` at ``unit_cents`` each."""
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        _, held = self._lines.get(sku, (unit_cents, 0))
        self._lines[sku] = (unit_cents, held + quantity)

    def remove(self, sku, quantity=1):
        """Take ``quantity`` of ``sku`` out; the line goes when none are left."""
        unit_cents, held = self._lines[sku]
        if quantity > held:
            raise ValueError(f"only {held} of {sku} in the cart")
        if quantity == held:
            del self._lines[sku]
        else:
            self._lines[sku] = (unit_cents, held - quantity)

    def quantity(self, sku):
        return self._lines.get(sku, (0, 0))[1]

    def line_total(self, sku):
        """The line's price in cents, with the bulk discount when it applies."""
        unit_cents, quantity = self._lines[sku]
        total = unit_cents * quantity
        if quantity > BULK_QUANTITY:
            total -= total * BULK_DISCOUNT_PERCENT // 100
        return total

    def total(self):
        return sum(self.line_total(sku) for sku in self._lines)
