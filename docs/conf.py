"""Sphinx configuration of the gp_couple documentation.

Build (from the repository root; ``pip install -e ".[docs]"``)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

``-W`` turns every warning (a broken docstring, a missing reference target, a tutorial
that raises) into an error, as CI runs it. See ``docs/README.md`` for the choices below
and the measured build time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The package is imported from the checkout (autodoc), and the local extension
# (docs/_ext/gp_couple_docs.py: tutorial arguments and figures, the command reference)
# from docs/_ext.
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import gp_couple_docs  # noqa: E402  (needs the paths above)

# The tutorials run in their quick mode on one thread: deterministic and within the
# build's time budget on a shared 2-core machine (BLAS/OpenMP pools of two threads stall
# under contention, see benchmarks/RESULTS.md "Thread pools under CPU contention").
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

project = "gp_couple"
author = "gp_couple developers"
copyright = "gp_couple developers"
release = version = gp_couple_docs.package_version()

extensions = [
    "sphinx.ext.autodoc",       # API reference from the reST docstrings (:param:, .. math::)
    "sphinx.ext.autosummary",   # one page per module, generated recursively
    "sphinx.ext.mathjax",       # the docstrings' .. math:: and :math:
    "sphinx.ext.viewcode",      # "[source]" links next to every documented object
    "sphinx_gallery.gen_gallery",  # tutorials/ executed (quick mode) with figures and run times
    "gp_couple_docs",           # the gp-couple command reference, generated from gp_couple.cli
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "README.md"]
# Generated API pages live in docs/api/ (gitignored), rebuilt on every run.
autosummary_generate = True
autosummary_generate_overwrite = True
autodoc_member_order = "bysource"
# Signatures stay short; the types go next to each :param: in the description.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
# Names written between single backquotes in the tutorials' prose are code.
default_role = "literal"

# Theme: furo (PyPI, pure Python, no JavaScript build step). Chosen over
# sphinx-rtd-theme for its search-as-you-type sidebar over a deep module tree, dark
# mode, and wide content area (the docstrings' equations and the benchmark tables), and
# over pydata-sphinx-theme for needing no configuration to render sphinx-gallery pages.
html_theme = "furo"
html_title = f"gp_couple {release}"
html_static_path: list[str] = []

sphinx_gallery_conf = {
    "examples_dirs": [str(ROOT / "tutorials")],
    "gallery_dirs": ["tutorials"],
    # Executed: every tutorial that needs no data directory; the others are rendered as
    # code and prose (CI has no data, and the build must not depend on it).
    "filename_pattern": gp_couple_docs.EXECUTED_TUTORIALS,
    # ``--quick`` (and ``--output`` into docs/_build) on each tutorial's command line.
    "reset_argv": "gp_couple_docs.tutorial_argv",
    # The tutorials write PNG files through gp_couple.experiments.plotting (no pyplot): show them.
    "image_scrapers": ("gp_couple_docs.tutorial_figures",),
    "within_subsection_order": "gp_couple_docs.TutorialOrder",
    "abort_on_example_error": True,
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "capture_repr": (),
}
