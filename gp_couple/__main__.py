"""``python -m gp_couple`` runs the command line."""

import sys

from .cli import main

if __name__ == "__main__":  # importing the module (documentation tools do) runs nothing
    sys.exit(main())
