"""``python -m meshplan.demo [OPTIONS]``: the same as ``meshplan demo [OPTIONS]`` (what
``make demo`` runs)."""

import sys

from meshplan.cli import main

sys.exit(main(["demo", *sys.argv[1:]], prog_name="meshplan"))
