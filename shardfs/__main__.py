import sys

from shardfs.cli import main

sys.exit(main())
