"""Paper experiments, each exposed as a ``gp-couple`` sub-command with ``--json`` output.

Every experiment module defines ``register(subparsers)``, which adds its sub-command
and sets ``func`` to a callable that takes the parsed arguments, runs the experiment
and prints its report with :func:`gp_couple.experiments._report.emit`.
"""
