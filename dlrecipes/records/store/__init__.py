"""Where a run lives: a local runs folder, or an object store (``s3://...``) staged locally and mirrored to it."""
