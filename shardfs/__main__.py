"""``python -m shardfs``: the ``shardfs`` command line (``shardfs.app.cli``)."""

import sys

from shardfs.app.cli import main

sys.exit(main())
