"""Graph specifications for experiment command lines (see :mod:`gp_couple.datasets.graph_specs`)."""

from __future__ import annotations

from ..datasets.graph_specs import PROCEDURAL_HELP, resolve_graph

__all__ = ["PROCEDURAL_HELP", "resolve_graph"]
