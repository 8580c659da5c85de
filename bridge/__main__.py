"""`python -m bridge`: the dts-bridge command line (see bridge/cli/main.py and docs/cli.md)."""
import sys

from bridge.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
