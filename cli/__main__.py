"""`python -m goaltender.cli`: as the `goaltender` command (the runner starts its fetches so)."""

import sys

from goaltender.cli import main

sys.exit(main())
