"""Print the sample store's stock report."""

from inventory.report import report
from inventory.store import sample_store

print(report(sample_store()))
