"""``python -m bench.peers.microbatcher``: see bench/peers/microbatcher/cli.py."""

import sys

from bench.peers.microbatcher.cli import main

sys.exit(main())
