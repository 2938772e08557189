"""gp_couple: variance-reducing couplings for random features, for GPyTorch and Pyro.

Implements Reid et al., "Variance-Reducing Couplings for Random Features" (ICLR 2025).
"""

from __future__ import annotations

from .graphs import Graph, grid_graph, icosphere_graph

__version__ = "0.1.0"

__all__ = ["Graph", "grid_graph", "icosphere_graph", "__version__"]
