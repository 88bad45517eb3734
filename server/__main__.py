"""``python -m server``: tritonserver over model_repository/ in the foreground (server.serve)."""

import sys

from server.serve import main

if __name__ == "__main__":
    sys.exit(main())
