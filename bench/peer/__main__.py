"""``python -m bench.peer``: see bench/peer/cli.py."""

import sys

from bench.peer.cli import main

sys.exit(main())
