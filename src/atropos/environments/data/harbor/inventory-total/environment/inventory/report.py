"""The stock report, one line per item, in the currency of $SHOP_CURRENCY."""

import os


def report(store):
    currency = os.environ.get("SHOP_CURRENCY", "USD")
    lines = [
        f"{item.name} {item.quantity} x {item.unit_price:.2f} {currency}" for item in store.items
    ]
    return "\n".join(lines)
