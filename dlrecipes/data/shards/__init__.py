"""Dataset shards in litdata's layout: any dataset written as shards to a folder or a bucket, and read by index
through a node's bounded cache.

Modules:
- :mod:`.cache`: shards' samples read as data, and a node's cache of a bucket's shards within its limit
- :mod:`.dataset`: dataset shards read by index from a bucket or a folder, through a bounded cache
- :mod:`.write`: any dataset written as shards to a folder or a bucket, its index last
"""
