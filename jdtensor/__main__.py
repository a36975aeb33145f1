"""``python -m jdtensor``."""

import sys

from jdtensor.cli import main

if __name__ == "__main__":
  sys.exit(main())
