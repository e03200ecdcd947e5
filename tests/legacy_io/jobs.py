"""The job loop the legacy I/O scripts share (each runs in the Python its library lives in):
``argv[1]`` is a JSON list of jobs; each is handled by the function its ``op`` names; prints
a JSON list of results, ``{"error": "..."}`` for a job the library refused."""

from __future__ import annotations

import json
import sys
from typing import Callable


def run(ops: dict[str, Callable[[dict], dict]]) -> None:
    results = []
    for job in json.loads(sys.argv[1]):
        try:
            results.append(ops[job["op"]](job))
        except Exception as e:  # noqa: BLE001 - report what the library refused, job by job
            results.append({"error": f"{type(e).__name__}: {e}"})
    print(json.dumps(results))
