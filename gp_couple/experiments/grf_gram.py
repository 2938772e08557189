r"""``gp-couple grf-gram``: Gram-matrix estimation with coupled GRFs (paper, Figure 3, Section 4.2
[fig:permuton_grf], Figure 10, Appendix F.1 [fig:grfs_more_graphs]).

For each kernel, termination probability and number of walkers, the relative Frobenius
error :math:`\|K - \widehat K\|_F / \|K\|_F` of :math:`\widehat K = \Phi\Phi^\top` is
measured over independent repeats for i.i.d., antithetic and :math:`\sigma`-coupled
walkers. The :math:`\sigma`-couplings are fitted first, per kernel and
:math:`p_\mathrm{halt}`, on an Erdős–Rényi graph (N = 100, order 30: Section 4.2 "Experiments with
σ-coupled GRFs" [sec:graph_gp_experiments]) and then used on the target graph.
"""

from __future__ import annotations

import argparse
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..couplings.walk_lengths import SigmaCoupling
from ..datasets.graph_specs import resolve_graph
from ..evaluation import relative_frobenius_error
from ..exact import exact_kernel_matrix
from ..features.graph_random_features import GraphRandomFeatures, gram_estimate
from ..features.sigma_fit import fit_sigma_coupling
from ..kernel_families import Diffusion, KernelFamily, RegularisedLaplacian
from ..progress import progress
from ._couplings import walk_length_couplings, with_direction_labels
from ._options import GRF_GRAM_KERNELS
from ._report import add_ratio_to_baseline, figure_folder, log_figures, summarize


def build_family(family_name: str, args: argparse.Namespace) -> KernelFamily:
    """The experiment's kernel family: 2-regularised Laplacian with sigma = 1 (Appendix F.1 "More results
    for Gram matrix estimation" [app:more_grf_results]) or diffusion."""
    if family_name == "regularised-laplacian":
        return RegularisedLaplacian(sigma=args.sigma, degree=args.degree)
    if family_name == "diffusion":
        return Diffusion(gamma=args.gamma)
    raise ValueError(f"unknown kernel family {family_name!r}; choose from {GRF_GRAM_KERNELS}")


def fitted_sigma(kernel_family: KernelFamily, p_halt: float, args: argparse.Namespace) -> SigmaCoupling:
    """A σ-coupling fitted for this kernel family and p_halt on ER(100) (saved as JSON if asked)."""
    coupling = fit_sigma_coupling(kernel_family, p_halt, args.order, samples_per_bin=args.fit_samples,
                                  seed=args.seed)
    if args.save_couplings:
        directory = Path(args.save_couplings)
        directory.mkdir(parents=True, exist_ok=True)
        coupling.save(directory / f"sigma_{kernel_family.__class__.__name__}_p{p_halt:g}_n{args.order}.json")
    return coupling


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment and return its report."""
    for walkers in args.walkers:
        if walkers % 2 and any(c != "iid" for c in args.couplings):
            raise ValueError(f"paired couplings need an even number of walkers, got {walkers}")
    folder = figure_folder(args)
    graph = resolve_graph(args.graph, args.data_dir, largest_component=args.largest_component)
    results: list[dict[str, Any]] = []
    permutations: list[dict[str, Any]] = []
    for family_name in args.kernels:
        family = build_family(family_name, args)
        with torch.no_grad():
            exact = exact_kernel_matrix(family, graph).numpy()
        for p_halt in args.p_halt:
            couplings = walk_length_couplings(
                args.couplings, lambda: fitted_sigma(family, p_halt, args))  # noqa: B023 - called in this iteration
            if isinstance(couplings.get(SigmaCoupling.name), SigmaCoupling):
                permutations.append({"kernel": family_name, "p_halt": p_halt,
                                     "permutation": couplings[SigmaCoupling.name].permutation.tolist()})
            for walkers in args.walkers:
                rows = []
                for (coupling_name, coupling), directions in product(couplings.items(), args.directions):
                    errors = []
                    for repeat in progress(range(args.repeats), description=f"{walkers} {coupling_name} "
                                           f"{directions} walkers, p_halt {p_halt:g}", unit="repeat"):
                        seed = np.random.SeedSequence([args.seed, repeat, walkers]).generate_state(1)[0]
                        sets = [GraphRandomFeatures.sample(
                            graph, walkers, p_halt, coupling, seed=int(seed) + offset,
                            dtype=torch.float64, proposal=args.proposal, directions=directions)
                            for offset in range(2 if args.two_sets else 1)]
                        with torch.no_grad():
                            f = family.modulation(max(g.num_terms for g in sets)).reshape(-1)
                        estimate = gram_estimate(sets[0], f.double(), sets[1] if args.two_sets else None)
                        errors.append(relative_frobenius_error(exact, estimate))
                    rows.append({"kernel": family_name, "p_halt": p_halt, "walkers": walkers,
                                 "coupling": coupling_name, "directions": directions,
                                 "error": summarize(errors)})
                add_ratio_to_baseline(rows, "error")
                results.extend(rows)
    report = {
        "experiment": "grf-gram",
        "graph": {"spec": args.graph, "nodes": graph.num_nodes, "edges": graph.num_edges},
        "config": {"repeats": args.repeats, "order": args.order, "fit_samples": args.fit_samples,
                   "two_sets": args.two_sets, "seed": args.seed, "proposal": args.proposal,
                   "kernel_hyperparameters": {"regularised-laplacian": {"sigma": args.sigma, "degree": args.degree},
                                              "diffusion": {"gamma": args.gamma}}},
        "notes": ["error = ||K - K_hat||_F / ||K||_F (mean ± standard error over repeats)",
                  "sigma-couplings fitted on Erdos-Renyi(N=100, p=0.1) per kernel and p_halt"],
        "results": results,
        "sigma_permutations": permutations,
    }
    if folder is not None:
        from .plotting import plot_gram_error_vs_p_halt

        log_figures([plot_gram_error_vs_p_halt(
            with_direction_labels(results), folder / "grf_gram_error_vs_p_halt.png", permutations=permutations,
            title=f"Gram error on {args.graph} ({graph.num_nodes} nodes); insets: fitted sigma permutations")])
    return report
