#!/bin/bash
set -e
cd /srv/shop
cat >> inventory/store.py <<'PY'


def _total_value(self):
    return sum(item.value() for item in self.items)


Store.total_value = _total_value
PY
cat > inventory/report.py <<'PY'
"""The stock report, one line per item, in the currency of $SHOP_CURRENCY."""

import os


def report(store):
    currency = os.environ.get("SHOP_CURRENCY", "USD")
    lines = [
        f"{item.name} {item.quantity} x {item.unit_price:.2f} {currency}" for item in store.items
    ]
    lines.append(f"TOTAL {store.total_value():.2f} {currency}")
    return "\n".join(lines)
PY
