"""Local Sphinx extension of the gp_couple documentation.

* How sphinx-gallery runs the tutorials: their command line (``--quick``, and
  ``--output`` into ``docs/_build/tutorial_figures/<name>``), which of them run, their
  order, and an image scraper that shows the PNG files they write. The tutorials draw
  with :mod:`gp_couple.experiments.plotting`, which renders with matplotlib's object-oriented API and
  never opens a ``pyplot`` figure, so sphinx-gallery's matplotlib scraper sees nothing.
* ``.. gp-couple-top-level-names::``: the names ``from gp_couple import ...`` offers, linked
  to the modules that define them.
* ``.. gp-couple-help:: COMMAND``: the ``gp-couple COMMAND --help`` text, built from
  :func:`gp_couple.cli.build_parser`, so the command reference cannot drift from the
  code. A command of :data:`gp_couple.cli.COMMANDS` that no page shows is a warning
  (an error under ``-W``).

sphinx-gallery's options name these objects by their dotted names (``gp_couple_docs.x``):
Sphinx pickles its configuration, and functions defined in ``conf.py`` cannot be.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

#: Tutorials that read the data directory (``--data-dir`` / ``$GP_COUPLE_DATA``). The
#: docs build needs no data, so these pages show code and prose without outputs.
NEEDS_DATA = ("swap_rff_kernel", "traffic_regression")
#: sphinx-gallery's ``filename_pattern`` (searched in each tutorial's path): all but the above.
EXECUTED_TUTORIALS = r"[\\/](?!(?:" + "|".join(NEEDS_DATA) + r")\.py$)[^\\/]+\.py$"
#: Reading order of the gallery; tutorials not listed follow, by file name.
ORDER = ("graph_random_features", "choosing_a_coupling", "mesh_interpolation", "traffic_regression",
         "variational_graph_gp", "pyro_nuts", "sparse_spectrum_gp", "swap_rff_kernel")


def package_version() -> str:
    """``gp_couple.__version__`` (cheap: the package imports its submodules lazily)."""
    import gp_couple

    return gp_couple.__version__


class TutorialOrder:
    """sphinx-gallery ``within_subsection_order``: :data:`ORDER`, then by file name."""

    def __init__(self, src_dir: str) -> None:
        self.src_dir = src_dir

    def __call__(self, filename: str) -> tuple[int, str]:
        stem = Path(filename).stem
        return (ORDER.index(stem) if stem in ORDER else len(ORDER), stem)

    def __repr__(self) -> str:  # sphinx-gallery compares configurations by repr
        return "TutorialOrder"


def _figure_folder(gallery_conf: dict[str, Any], src_file: str) -> Path:
    return Path(gallery_conf["src_dir"]) / "_build" / "tutorial_figures" / Path(src_file).stem


#: PNG files already shown, per figure folder: name -> modification time (ns).
_shown: dict[Path, dict[str, int]] = {}


def tutorial_argv(gallery_conf: dict[str, Any], script_vars: dict[str, Any]) -> list[str]:
    """sphinx-gallery ``reset_argv``: the quick mode, figures into a fresh folder."""
    source = Path(script_vars["src_file"])
    argv = ["--quick"]
    if '"--output"' in source.read_text(encoding="utf-8"):
        folder = _figure_folder(gallery_conf, str(source))
        shutil.rmtree(folder, ignore_errors=True)  # no figure of an earlier build is shown
        _shown[folder] = {}
        argv += ["--output", str(folder)]
    return argv


def tutorial_figures(block: Any, block_vars: dict[str, Any], gallery_conf: dict[str, Any]) -> str:
    """sphinx-gallery image scraper: the PNG files a code block wrote into ``--output``.

    :return: reST showing them below the block ('' when it wrote none).
    """
    from sphinx_gallery.scrapers import figure_rst

    folder = _figure_folder(gallery_conf, block_vars["src_file"])
    shown = _shown.setdefault(folder, {})
    written = sorted(folder.glob("*.png"), key=lambda path: (path.stat().st_mtime_ns, path.name))
    fresh = [path for path in written if shown.get(path.name) != path.stat().st_mtime_ns]
    targets = []
    for path in fresh:
        shown[path.name] = path.stat().st_mtime_ns
        target = next(block_vars["image_path_iterator"])
        shutil.copyfile(path, target)
        targets.append(target)
    return figure_rst(targets, gallery_conf["src_dir"]) if targets else ""


def _command_help(command: str | None) -> str:
    from gp_couple import cli

    parser = cli.build_parser([] if command is None else [command])
    if command is not None:
        subparsers = next(action for action in parser._actions
                          if isinstance(action, argparse._SubParsersAction))
        parser = subparsers.choices[command]
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "90"  # argparse wraps to the terminal; pages get a fixed width
    try:
        text = parser.format_help()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return re.sub(r"[ \t]+\n", "\n", text).rstrip()


class CommandHelp(SphinxDirective):
    """``.. gp-couple-help:: [COMMAND]``: the help text of ``gp-couple [COMMAND]``."""

    optional_arguments = 1

    def run(self) -> list[nodes.Node]:
        from gp_couple.cli import COMMANDS

        command = self.arguments[0] if self.arguments else None
        if command is not None and command not in COMMANDS:
            raise self.error(f"unknown gp-couple command {command!r}; known: {', '.join(COMMANDS)}")
        self.env.gp_couple_commands = getattr(self.env, "gp_couple_commands", {})
        self.env.gp_couple_commands.setdefault(self.env.docname, set()).add(command or "")
        text = _command_help(command)
        block = nodes.literal_block(text, text, language="text")
        self.set_source_info(block)
        return [block]


class TopLevelNames(SphinxDirective):
    """``.. gp-couple-top-level-names::``: a summary table of the names ``gp_couple`` exports
    (its ``__all__``), each linked to its description in the module that defines it."""

    def run(self) -> list[nodes.Node]:
        import gp_couple

        lines = [".. autosummary::", ""]
        for name in gp_couple.__all__:
            value = getattr(gp_couple, name)
            if hasattr(value, "__qualname__"):  # classes and functions; not __version__
                lines.append(f"   {value.__module__}.{value.__qualname__}")
        return self.parse_text_to_nodes("\n".join(lines))


def _purge(app: Sphinx, env: Any, docname: str) -> None:
    getattr(env, "gp_couple_commands", {}).pop(docname, None)


def _merge(app: Sphinx, env: Any, docnames: set[str], other: Any) -> None:
    env.gp_couple_commands = getattr(env, "gp_couple_commands", {})
    env.gp_couple_commands.update(getattr(other, "gp_couple_commands", {}))


def _check_every_command_shown(app: Sphinx, env: Any) -> None:
    from gp_couple.cli import COMMANDS

    shown = set().union(*getattr(env, "gp_couple_commands", {}).values())
    missing = [name for name in COMMANDS if name not in shown]
    if missing:
        logger.warning("gp-couple commands without a '.. gp-couple-help::' page: %s", ", ".join(missing))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("gp-couple-help", CommandHelp)
    app.add_directive("gp-couple-top-level-names", TopLevelNames)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check_every_command_shown)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
