"""`python -m pto_gpu`: the `pto-gpu` command (pto_gpu.cli)."""

import sys

from .cli import main

sys.exit(main())
