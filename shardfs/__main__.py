"""``python -m shardfs``: the ``shardfs`` command line (``shardfs.cli``)."""

import sys

from shardfs.cli import main

sys.exit(main())
