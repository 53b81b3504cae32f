"""An item of stock: a name, how many, and the price of one."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    name: str
    quantity: int
    unit_price: float

    def value(self):
        return self.quantity * self.unit_price
