"""`python -m bridge`: the dts-bridge command line (see bridge/cli.py and docs/cli.md)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
