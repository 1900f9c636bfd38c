"""Read a wandb offline run's transaction log (``run-*.wandb``) with wandb's own record schema.

wandb >= 0.19 moved its Python reader into the Go core; the file is the documented LevelDB
log format (32 KiB blocks; records of crc32c, little-endian length, type), after a 7-byte
W&B header, and each record is a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7  # b":W&B", magic (2 bytes), version
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, pos, pending = [], HEADER, b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:  # too little room for a header: the block is padded
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def finished_records(run_dir: Path, timeout: float = 30.0) -> list:
    """The records of an offline run that ended, once they are all on disk. ``wandb.finish`` returns when the run
    has ended, but wandb's service (wandb-core, a process of its own) may still be writing the transaction log's
    last buffered part: seen with wandb 0.31 when the run was started in the test's own process (the service
    lives on), one read in four. The log is whole once its ``exit`` record is there, the last one written."""
    import time

    (log,) = Path(run_dir).glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = read_records(log)
        except Exception:  # noqa: BLE001 - a record still being written; raised again past the deadline
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def history(run_dir: Path) -> list[dict]:
    """The rows passed to ``wandb.log`` in an offline run directory."""
    rows = []
    for record in finished_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def run_summary(run_dir: Path) -> dict:
    """An offline run's config (key -> value), tags, logged artifacts (name -> file paths) and exit code."""
    out: dict = {"config": {}, "tags": [], "artifacts": {}, "exit_code": None}
    for record in finished_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            out["config"].update({item.key: json.loads(item.value_json) for item in record.config.update if item.key})
        elif kind == "run":
            out["tags"] = list(record.run.tags) or out["tags"]
        elif kind == "artifact":
            out["artifacts"][record.artifact.name] = [entry.path for entry in record.artifact.manifest.contents]
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out
