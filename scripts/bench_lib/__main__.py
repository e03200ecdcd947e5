"""``python -m bench_lib`` (what scripts/bench runs, with scripts/ and the repository on PYTHONPATH)."""

import sys

from bench_lib.main import main

sys.exit(main())
