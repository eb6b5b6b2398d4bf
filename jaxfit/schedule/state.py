"""The state of a running schedule, in SQLite: what survives the scheduler being killed.

One file, ``<state dir>/state.sqlite`` (WAL mode, every write committed at once), holds

- ``meta``: the queue file, the plan (``ScheduledRun`` and ``packing.Plan`` as JSON), the backend,
  the WandB group, when the schedule was created;
- ``experiments``: one row per experiment: its GPU, fraction, current batch and accumulation, state,
  attempts, the pid of its live attempt, start and end times, the last exit code and reason;
- ``attempts``: one row per start of an experiment (batch, accumulation, log file, exit code, outcome);
- ``events``: a log of every decision (planned, started, out of memory, retried, timed out...);
- ``samples``: what the GPU monitor measured (per GPU, and per process with the experiment it
  belongs to).

States of an experiment: ``pending`` (not started, or waiting to be retried), ``running``,
``done`` (exit 0), ``failed`` (no retries left), ``timeout`` (stopped at its time limit),
``interrupted`` (stopped by Ctrl-C/SIGTERM of the scheduler; ``--resume`` starts it again). ``done``,
``failed`` and ``timeout`` are final: ``--resume`` never runs them again.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxfit.errors import ConfigError


class RunState(enum.StrEnum):
    """Where an experiment of a schedule stands (stored as its value)."""

    PENDING = "pending"
    """Not started, or waiting to be started again."""
    RUNNING = "running"
    DONE = "done"
    """Exited 0."""
    FAILED = "failed"
    """No retries left, or it could not start."""
    TIMEOUT = "timeout"
    """Stopped at its time limit."""
    INTERRUPTED = "interrupted"
    """Stopped with the scheduler (Ctrl-C, SIGTERM); ``--resume`` starts it again."""

    def is_final(self) -> bool:
        """Whether ``--resume`` leaves it alone (done, failed, timeout)."""
        return self in (RunState.DONE, RunState.FAILED, RunState.TIMEOUT)


FINAL_STATES = tuple(s.value for s in RunState if s.is_final())
"""States ``--resume`` leaves alone."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiments (
    name TEXT PRIMARY KEY, position INTEGER NOT NULL, gpu INTEGER NOT NULL, mem_fraction REAL NOT NULL,
    batch_size INTEGER NOT NULL, grad_accum_steps INTEGER NOT NULL,
    need_bytes INTEGER NOT NULL, command TEXT NOT NULL, env TEXT NOT NULL, retries INTEGER NOT NULL,
    timeout REAL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, crashes INTEGER NOT NULL DEFAULT 0,
    pid INTEGER, started_at REAL, ended_at REAL, exit_code INTEGER, reason TEXT, log_path TEXT, pin_path TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    name TEXT NOT NULL, attempt INTEGER NOT NULL, batch_size INTEGER NOT NULL, grad_accum_steps INTEGER NOT NULL,
    pid INTEGER, started_at REAL NOT NULL, ended_at REAL, exit_code INTEGER, outcome TEXT, log_path TEXT NOT NULL,
    host TEXT, PRIMARY KEY (name, attempt)
);
CREATE TABLE IF NOT EXISTS events (t REAL NOT NULL, name TEXT, kind TEXT NOT NULL, text TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    t REAL NOT NULL, gpu INTEGER NOT NULL, used_bytes INTEGER NOT NULL, total_bytes INTEGER,
    utilization REAL, name TEXT, pid INTEGER
);
"""


@dataclasses.dataclass(frozen=True)
class ExperimentRecord:
    """One row of ``experiments``.

    Attributes:
      name: The experiment.
      position: Its place in the plan's start order.
      gpu: The GPU it runs on (position among the visible GPUs, or a logical index).
      mem_fraction: Its ``XLA_PYTHON_CLIENT_MEM_FRACTION``.
      batch_size: The batch of its latest (or next) attempt (smaller after an out-of-memory retry).
      grad_accum_steps: The accumulation of its latest (or next) attempt.
      need_bytes: The physical memory the plan charges it on its GPU (pool + per-process overhead).
      command: Its command as planned (batch and accumulation flags are set per attempt).
      env: The names of the extra environment variables the queue sets (their values are not
        stored: they may be secrets; the scheduler takes them from the queue file).
      retries: How many crashes it may be started again after.
      timeout: Seconds before it is stopped (None: no limit).
      state: See the module docstring.
      attempts: How many times it was started.
      crashes: How many attempts failed other than by running out of memory.
      pid: The process (group leader) of the live attempt.
      started_at: Unix time of the first start (None: never started).
      ended_at: Unix time it reached a final state.
      exit_code: The exit code of the latest attempt.
      reason: Why it is in its state (one line).
      log_path: The log file of the latest attempt.
      pin_path: The ``pin.json`` of the program its fit proved (a copy in the state folder; None:
        nothing pinned), which its attempts load (:mod:`jaxfit.fit.pin`).
    """

    name: str
    position: int
    gpu: int
    mem_fraction: float
    batch_size: int
    grad_accum_steps: int
    need_bytes: int
    command: tuple[str, ...]
    env: tuple[str, ...]
    retries: int
    timeout: float | None
    state: RunState = RunState.PENDING
    attempts: int = 0
    crashes: int = 0
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    log_path: str | None = None
    pin_path: str | None = None

    @property
    def final(self) -> bool:
        """Whether ``--resume`` leaves it alone."""
        return RunState(self.state).is_final()

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` entry: name, gpu, mem_fraction, batch_size, state, attempts, times, and more."""
        data = dataclasses.asdict(self)
        data["command"] = list(self.command)
        data["env"] = list(self.env)
        return data


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One start of an experiment (a row of ``attempts``)."""

    name: str
    attempt: int
    batch_size: int
    grad_accum_steps: int
    pid: int | None
    started_at: float
    ended_at: float | None
    exit_code: int | None
    outcome: str | None
    log_path: str
    host: str | None = None
    """The host (and, on a Ray cluster, the node) the attempt ran on, once known."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One GPU monitor reading: a whole GPU (``name`` None) or one process on it."""

    t: float
    gpu: int
    used_bytes: int
    total_bytes: int | None = None
    utilization: float | None = None
    name: str | None = None
    pid: int | None = None


_EXPERIMENT_COLUMNS = [f.name for f in dataclasses.fields(ExperimentRecord)]
_ATTEMPT_COLUMNS = [f.name for f in dataclasses.fields(Attempt)]


class StateStore:
    """The SQLite file of one schedule. Safe to use from several threads of one process."""

    def __init__(self, path: str | Path) -> None:
        """Open (or create) the state file.

        Raises:
          ConfigError: the folder cannot be written, or the file is not a readable SQLite state
            (state is not disposable, so it is never replaced: the message says what to do).
        """
        self.path = Path(path)
        self._lock = threading.RLock()
        fresh = not self.path.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(
                f"cannot open the schedule state {self.path}: {getattr(e, 'strerror', None) or e}; "
                "choose a writable folder with --state-dir"
            ) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(experiments)")}
            if "pin_path" not in columns:  # a state written by jaxfit 0.2
                self._db.execute("ALTER TABLE experiments ADD COLUMN pin_path TEXT")
            if "host" not in {row[1] for row in self._db.execute("PRAGMA table_info(attempts)")}:  # jaxfit 0.4
                self._db.execute("ALTER TABLE attempts ADD COLUMN host TEXT")
        except sqlite3.Error as e:
            self._db.close()
            readonly = isinstance(e, sqlite3.OperationalError) and "readonly" in str(e)
            if fresh and not readonly:
                raise ConfigError(f"cannot create the schedule state {self.path} ({e}; is its disk full?)") from None
            raise ConfigError(
                f"cannot use the schedule state {self.path}: "
                + (
                    f"its folder is not writable ({e}); choose another with --state-dir"
                    if readonly
                    else f"it is not a readable jaxfit state ({e}); move it aside to start afresh, or pass --state-dir"
                )
            ) from None

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()

    # -- meta ---------------------------------------------------------------------------------

    def set_meta(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-encoded) under ``key``."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def meta(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` (``default`` if none)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    # -- experiments ----------------------------------------------------------------------------

    def add_experiments(self, records: Sequence[ExperimentRecord]) -> None:
        """Insert the planned experiments (one transaction)."""
        rows = [self._row(r) for r in records]
        marks = ", ".join("?" * len(_EXPERIMENT_COLUMNS))
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    f"INSERT INTO experiments ({', '.join(_EXPERIMENT_COLUMNS)}) VALUES ({marks})", rows
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @staticmethod
    def _row(record: ExperimentRecord) -> tuple[Any, ...]:
        values = []
        for column in _EXPERIMENT_COLUMNS:
            value = getattr(record, column)
            if column == "command":
                value = json.dumps(list(value))
            elif column == "env":
                value = json.dumps(sorted(value))  # names only
            values.append(value)
        return tuple(values)

    def experiments(self) -> list[ExperimentRecord]:
        """Every experiment, in plan order."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {', '.join(_EXPERIMENT_COLUMNS)} FROM experiments ORDER BY position"
            ).fetchall()
        out = []
        for row in rows:
            data = dict(zip(_EXPERIMENT_COLUMNS, row))
            data["command"] = tuple(json.loads(data["command"]))
            data["state"] = RunState(data["state"])
            env = json.loads(data["env"])
            data["env"] = tuple(sorted(env))  # (a dict in states of jaxfit 0.2: only its names are kept)
            out.append(ExperimentRecord(**data))
        return out

    def experiment(self, name: str) -> ExperimentRecord:
        """One experiment (KeyError if none)."""
        for record in self.experiments():
            if record.name == name:
                return record
        raise KeyError(name)

    def update(self, name: str, **changes: Any) -> None:
        """Set columns of one experiment (committed at once)."""
        if not changes:
            return
        unknown = set(changes) - set(_EXPERIMENT_COLUMNS)
        if unknown:
            raise KeyError(f"unknown experiment columns {sorted(unknown)}")
        sets = ", ".join(f"{column} = ?" for column in changes)
        with self._lock:
            self._db.execute(f"UPDATE experiments SET {sets} WHERE name = ?", (*changes.values(), name))

    # -- attempts -------------------------------------------------------------------------------

    def start_attempt(self, attempt: Attempt) -> None:
        """Record the start of an attempt."""
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO attempts ({', '.join(_ATTEMPT_COLUMNS)}) VALUES "
                f"({', '.join('?' for _ in _ATTEMPT_COLUMNS)})",
                dataclasses.astuple(attempt),
            )

    def set_attempt_host(self, name: str, attempt: int, host: str) -> None:
        """Record where an attempt runs."""
        with self._lock:
            self._db.execute("UPDATE attempts SET host = ? WHERE name = ? AND attempt = ?", (host, name, attempt))

    def end_attempt(self, name: str, attempt: int, *, ended_at: float, exit_code: int | None, outcome: str) -> None:
        """Record how an attempt ended."""
        with self._lock:
            self._db.execute(
                "UPDATE attempts SET ended_at = ?, exit_code = ?, outcome = ? WHERE name = ? AND attempt = ?",
                (ended_at, exit_code, outcome, name, attempt),
            )

    def attempts(self, name: str | None = None) -> list[Attempt]:
        """The attempts of one experiment (or all), in start order."""
        query = (
            f"SELECT {', '.join(_ATTEMPT_COLUMNS)} FROM attempts"
            + (" WHERE name = ?" if name else "")
            + " ORDER BY started_at, attempt"
        )
        with self._lock:
            rows = self._db.execute(query, (name,) if name else ()).fetchall()
        return [Attempt(*row) for row in rows]

    # -- events and samples ---------------------------------------------------------------------

    def event(self, kind: str, text: str, name: str | None = None, t: float | None = None) -> None:
        """Log a decision."""
        with self._lock:
            self._db.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?)", (time.time() if t is None else t, name, kind, text)
            )

    def events(self) -> list[tuple[float, str | None, str, str]]:
        """Every event ``(t, experiment, kind, text)`` in time order."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM events ORDER BY t, rowid").fetchall()
        return [(float(t), name, str(kind), str(text)) for t, name, kind, text in rows]

    def add_samples(self, samples: Sequence[Sample]) -> None:
        """Store monitor readings (one transaction)."""
        if not samples:
            return
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?)", [dataclasses.astuple(s) for s in samples]
            )
            self._db.execute("COMMIT")

    def samples(self) -> list[Sample]:
        """Every monitor reading, in time order."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM samples ORDER BY t, rowid").fetchall()
        return [Sample(*row) for row in rows]

    def iter_names(self) -> Iterator[str]:
        """The experiment names in plan order."""
        return (r.name for r in self.experiments())
