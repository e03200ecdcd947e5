"""``python -m shardfs``: the ``shardfs`` command line (``shardfs.app.cli``); a daemon that
``shardfs mount`` spawned starts its zygote first (``shardfs.app.early``)."""

import sys

from shardfs.app import early

early.start()

from shardfs.app.cli import main  # noqa: E402  (after the zygote started: it imports meanwhile)

sys.exit(main())
