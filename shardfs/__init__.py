"""shardfs: a FUSE filesystem showing sharded Zarr v3 data as plain Zarr v2 arrays."""

__version__ = "0.1.0"
