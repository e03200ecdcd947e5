"""scripts/soak: hours of mixed load and faults on real mounts, checked against a model (issue 27).

Modules: ``model`` (which value each chunk may hold), ``grid`` (chunk arithmetic and v2 chunk
bytes, shared by every process), ``readers`` / ``writers`` / ``worker`` (the client processes,
run under zarr 2.18's venv or the main one; they import neither shardfs nor the controller),
``daemons`` (mounts started and stopped by PID), ``faults`` (the seeded schedule and the fault
injectors), ``faultproxy`` (503/500/reset/stall in front of S3), ``dataset`` (the arrays),
``checks`` (the op logs into the model, every read and the final source judged),
``metrics`` / ``report`` (per-minute CSV, PNG, summary), ``hazard`` (the zarr-python #3682
pattern), ``main`` (the controller).
"""
