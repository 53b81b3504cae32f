"""Environments that ship with atropos, registered as entry points (`atropos env list`).

- `arithmetic` (`atropos.environments.arithmetic:Arithmetic`): add two numbers below 100, the
  task of `make demo`.

Importing this package imports no environment (and no torch).
"""
