"""``python -m soak_lib`` (what scripts/soak runs, with scripts/ and the repository on PYTHONPATH)."""

from soak_lib.main import run

run()
