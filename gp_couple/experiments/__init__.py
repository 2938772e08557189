"""Paper experiments, each exposed as a ``gp-couple`` sub-command with ``--json`` output.

Every experiment module defines ``run(args)``, which takes the parsed arguments, runs the
experiment and returns its report; :mod:`gp_couple.cli` prints it with
:func:`gp_couple.experiments._report.emit`. The command's options are declared apart, in
:mod:`gp_couple.experiments._options`, so that parsing them imports neither torch nor
the module.
"""
