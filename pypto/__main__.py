"""`python -m pypto ...`: the same as the `pypto` command (see pypto.cli)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
