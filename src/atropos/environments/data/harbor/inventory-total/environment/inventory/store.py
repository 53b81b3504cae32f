"""The store: the items in stock, and a sample one."""

from inventory.models import Item


class Store:
    def __init__(self):
        self.items = []

    def add(self, name, quantity, unit_price):
        self.items.append(Item(name, quantity, unit_price))


def sample_store():
    store = Store()
    store.add("pencil", 10, 0.25)
    store.add("notebook", 3, 2.5)
    store.add("eraser", 4, 0.5)
    return store
