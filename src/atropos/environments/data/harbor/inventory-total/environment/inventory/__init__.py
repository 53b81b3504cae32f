"""A tiny stock keeper: items, a store of them, and a printed report."""
