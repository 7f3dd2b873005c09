"""`python -m svgen.cli`: the `svgen` command."""

import sys

from svgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
