"""What the tests (tests/) and the tools (scripts/bench, scripts/soak) both use: the sources they
build (``datasets``: the bench's arrays, ``v3``: Zarr v3 codec JSON and writers), the SeaweedFS
server (``seaweed``) and the TCP proxies in front of it (``delayproxy``: delaying and counting,
``faultproxy``: injecting faults). It imports ``shardfs`` and never ``tests`` or ``scripts``;
both of those import it (tests/conftest.py and the tools put the repository on ``sys.path``).
"""
