"""Reading what wandb 0.31 writes offline: it keeps no config.yaml, only the run's record file."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path


def wandb_records(path: Path) -> Iterator[object]:
    """The protobuf records of an offline WandB run file ``run-<id>.wandb``.

    The file is a 7-byte header (``:W&B``, a magic number, a version) followed by the LevelDB log
    format: 32 KiB blocks of chunks, each ``crc32:u32 length:u16 type:u8`` then the payload; a
    record is one FULL chunk or FIRST, MIDDLE..., LAST. (wandb 0.31 has no Python reader for it.)
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, parts = 32 * 1024, 7, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        parts.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def wandb_run(tmp_path: Path) -> tuple[str, dict[str, object], list[dict[str, object]]]:
    """``(run_id, config, history rows)`` of the single offline run under ``tmp_path/wandb``."""
    (run_dir,) = sorted((tmp_path / "wandb").glob("offline-run-*"))
    (run_file,) = run_dir.glob("run-*.wandb")
    config: dict[str, object] = {}
    history: list[dict[str, object]] = []
    run_id = ""
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        items = {
            "run": lambda r: r.run.config.update,
            "config": lambda r: r.config.update,
            "history": lambda r: r.history.item,
        }.get(kind)
        if items is None:
            continue
        values = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items(record)}
        if kind == "history":
            history.append(values)
        else:
            config.update(values)
            run_id = record.run.run_id or run_id
    return run_id, config, history
