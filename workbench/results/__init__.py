"""The results layer: the metric catalogue and the aggregation every table and figure uses.

- :mod:`workbench.results.catalogue`: names, descriptions, units, directions of metrics;
- :mod:`workbench.results.aggregate`: records from the store, grouping, mean/std/n/95% CI
  over seeds, best over grid keys (selected on validation or test), Welch winners;
- :mod:`workbench.results.stats`: Student t and Welch's t-test (scipy when installed).
"""
from workbench.results import catalogue  # noqa: F401
from workbench.results.aggregate import (  # noqa: F401
    SelectionError, best_cells, best_over, fields_of, grid_keys, group, metrics_of, records, summarize, table,
    winners,
)
