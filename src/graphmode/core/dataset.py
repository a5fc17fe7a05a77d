"""The profile dataset: an append-only SQLite table, one row per (mode, workload, repeat) attempt.

SQLite because every cell is committed the moment it finishes (a crash loses at most the cell in
flight), ``--resume`` is one indexed query, readers (train, the service) can open it while a profile is
writing, and it needs nothing beyond the standard library. Rows are never updated or deleted; a retried
cell appends a new row, and "done" means an ``ok`` row exists for the cell's key.

Columns are the flattened :class:`CellRecord`: workload features as ``obs_*``, fingerprint as ``fp_*``,
latency and startup fields under their own names; lists and dicts are JSON text.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graphmode.core.deployment import DeploymentConfig
from graphmode.core.errors import DatasetError
from graphmode.core.fingerprint import same_release
from graphmode.core.records import (
    CellRecord,
    Fingerprint,
    LatencyStats,
    ObservedFeatures,
    RaceInfo,
    RunConditions,
    StartupInfo,
    StepSizes,
)

SCHEMA_VERSION = 1
_KEY_COLUMNS: dict[str, str] = {
    "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "run_id": "TEXT NOT NULL",
    "profile_key": "TEXT NOT NULL",
    "mode": "TEXT NOT NULL",
    "workload": "TEXT NOT NULL",
    "workload_hash": "TEXT NOT NULL",
    "repeat": "INTEGER NOT NULL",
    "status": "TEXT NOT NULL",
    "reason": "TEXT",
    "started_at": "REAL NOT NULL",
    "finished_at": "REAL NOT NULL",
    "workload_spec": "TEXT NOT NULL",
    "gpu_mem_used_gib_max": "REAL",
    "gpu_mem_used_gib_mean": "REAL",
    # StepSizes as compact JSON; added after the first datasets, whose rows read NULL (see _migrate).
    "step_sizes": "TEXT",
}
_GROUPS: list[tuple[str, type[Any], str]] = [
    ("features", ObservedFeatures, "obs_"),
    ("latency", LatencyStats, ""),
    ("startup", StartupInfo, ""),
    ("fingerprint", Fingerprint, "fp_"),
    ("conditions", RunConditions, ""),
    ("race", RaceInfo, "race_"),
    # The deployment configuration (graphmode.core.deployment); rows from before it read NULL, and
    # deployment_of_row tells what their own args and logs prove.
    ("deployment", DeploymentConfig, "dep_"),
]
_SKIP = {("startup", "vllm_version")}  # the fingerprint holds it
# Columns renamed since they were first written (old -> new): an older dataset reads under the new name.
RENAMED_COLUMNS: dict[str, str] = {"engine_nvcsw_per_s": "engine_nivcsw_per_s"}


def _renamed(row: dict[str, Any]) -> dict[str, Any]:
    for old, new in RENAMED_COLUMNS.items():
        if old in row:
            value = row.pop(old)
            row.setdefault(new, value)
    return row


def _sql_type(annotation: Any) -> str:
    text = str(annotation)
    if "bool" in text:
        return "INTEGER"
    if "float" in text:
        return "REAL"
    if "int" in text and "list" not in text and "dict" not in text:
        return "INTEGER"
    return "TEXT"


def _columns() -> dict[str, str]:
    cols = dict(_KEY_COLUMNS)
    for group, model, prefix in _GROUPS:
        for name, field in model.model_fields.items():
            if (group, name) not in _SKIP:
                cols[prefix + name] = _sql_type(field.annotation)
    return cols


COLUMNS = _columns()


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value


def flatten(record: CellRecord, workload_hash: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        k: getattr(record, k) for k in _KEY_COLUMNS if k not in {"id", "workload_hash", "workload_spec", "step_sizes"}
    }
    row["workload_hash"] = workload_hash
    row["workload_spec"] = json.dumps(record.workload_spec, sort_keys=True)
    row["step_sizes"] = (None if record.step_sizes is None
                         else json.dumps(record.step_sizes.model_dump(), separators=(",", ":")))
    for group, model, prefix in _GROUPS:
        for name, value in (getattr(record, group) or model()).model_dump().items():
            if (group, name) not in _SKIP:
                row[prefix + name] = _cell(value)
    return row


def step_sizes_of(row: dict[str, Any]) -> StepSizes | None:
    """The :class:`StepSizes` a dataset row holds, as tokens per engine step (:meth:`StepSizes.per_engine_step`,
    with the row's --api-server-count where the histogram does not say: rows from before 2026-12-04);
    ``None`` for rows from before the column or unreadable JSON."""
    raw = row.get("step_sizes")
    if not raw:
        return None
    try:
        steps = StepSizes.model_validate_json(raw)
    except ValueError:
        return None
    servers = row.get("dep_api_server_count")
    return steps.per_engine_step(servers if isinstance(servers, int) and servers >= 1 else None)


class ProfileStore:
    """Append-only SQLite store of profile rows. Opening a corrupt file raises :class:`DatasetError`."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.is_file():
            raise DatasetError(f"no profile dataset at {self.path}")
        try:
            uri = f"file:{self.path}?mode=ro" if readonly else str(self.path)
            if not readonly:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(uri, uri=readonly, timeout=30.0, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._check()
            if not readonly:
                self._migrate()
        except sqlite3.DatabaseError as exc:
            raise DatasetError(f"{self.path} is not a readable profile dataset: {exc}") from exc

    def _check(self) -> None:
        ok = self._db.execute("PRAGMA quick_check").fetchone()[0]
        if ok != "ok":
            raise DatasetError(f"{self.path} failed SQLite's integrity check: {ok}")
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "cells" not in tables:
            raise DatasetError(f"{self.path} is an SQLite file but not a graphmode profile (no 'cells' table)")

    def _migrate(self) -> None:
        if not self.readonly:
            self._db.execute("PRAGMA journal_mode=WAL")
        cols = ", ".join(f'"{k}" {t}' for k, t in COLUMNS.items())
        self._db.execute(f"CREATE TABLE IF NOT EXISTS cells ({cols})")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        have = {r[1] for r in self._db.execute("PRAGMA table_info(cells)")}
        for old, new in RENAMED_COLUMNS.items():
            if old in have and new not in have:
                self._db.execute(f'ALTER TABLE cells RENAME COLUMN "{old}" TO "{new}"')
                have = (have - {old}) | {new}
        for name, sql_type in COLUMNS.items():
            if name not in have:  # columns added by a newer graphmode; old rows read NULL
                self._db.execute(f'ALTER TABLE cells ADD COLUMN "{name}" {sql_type}')
        self._db.execute(
            "CREATE INDEX IF NOT EXISTS cells_key ON cells (profile_key, mode, workload, workload_hash, repeat)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS cells_race ON cells (race_id, race_round)")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")

    def append(self, record: CellRecord, workload_hash: str) -> None:
        if self.readonly:
            raise DatasetError(f"{self.path} was opened read-only")
        row = flatten(record, workload_hash)
        names = ", ".join(f'"{k}"' for k in row)
        marks = ", ".join("?" for _ in row)
        try:
            with self._tx() as db:
                db.execute(f"INSERT INTO cells ({names}) VALUES ({marks})", list(row.values()))
        except sqlite3.Error as exc:
            raise DatasetError(f"cannot write to {self.path}: {exc}") from exc

    def done_cells(self, profile_key: str, vllm_version: str | None = None) -> set[tuple[str, str, str, int]]:
        """(mode, workload, workload_hash, repeat) of every cell with an ok row for *profile_key*.

        With ``vllm_version``, rows measured under another vLLM release do not count: the profile key
        is fixed before vLLM starts, so it cannot hold the version, and a resume after an upgrade must
        measure again. Rows that recorded no version still count.
        """
        cur = self._db.execute(
            "SELECT DISTINCT mode, workload, workload_hash, repeat, fp_vllm_version FROM cells "
            "WHERE profile_key = ? AND status = 'ok'",
            (profile_key,),
        )
        return {
            (r[0], r[1], r[2], int(r[3])) for r in cur
            if vllm_version is None or r[4] is None or same_release(r[4], vllm_version)
        }

    def race_rows(self, race_id: str) -> list[dict[str, Any]]:
        """Every row (ok and failed) of one race, in the order written: what a resumed race starts from."""
        try:
            cur = self._db.execute("SELECT * FROM cells WHERE race_id = ? ORDER BY id", (race_id,))
            return [dict(r) for r in cur]
        except sqlite3.Error as exc:
            raise DatasetError(f"cannot read {self.path}: {exc}") from exc

    def put_meta(self, key: str, value: str) -> None:
        """Set one key of the meta table (a race records each session's span there, rows or not)."""
        if self.readonly:
            raise DatasetError(f"{self.path} was opened read-only")
        try:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        except sqlite3.Error as exc:
            raise DatasetError(f"cannot write to {self.path}: {exc}") from exc

    def meta(self, prefix: str = "") -> dict[str, str]:
        try:
            cur = self._db.execute("SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix))
            return {str(k): str(v) for k, v in cur}
        except sqlite3.Error as exc:
            raise DatasetError(f"cannot read {self.path}: {exc}") from exc

    def rows(self, *, status: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM cells" + (" WHERE status = ?" if status else "") + " ORDER BY id"
        try:
            cur = self._db.execute(sql, (status,) if status else ())
            return [_renamed(dict(r)) for r in cur]
        except sqlite3.Error as exc:
            raise DatasetError(f"cannot read {self.path}: {exc}") from exc

    def mark_jit_kernels(self, marks: Mapping[int, str]) -> int:
        """Set ``engine_jit_kernels`` of the cells with these ids (read from engine logs after the fact),
        only where it was never set: a value the profiler recorded wins. Returns the rows changed."""
        if self.readonly:
            raise DatasetError(f"{self.path} was opened read-only")
        changed = 0
        try:
            with self._tx() as db:
                for row_id, kernels in marks.items():
                    cur = db.execute('UPDATE cells SET "engine_jit_kernels" = ? WHERE id = ? '
                                     'AND "engine_jit_kernels" IS NULL', (kernels, int(row_id)))
                    changed += cur.rowcount
        except sqlite3.Error as exc:
            raise DatasetError(f"cannot write to {self.path}: {exc}") from exc
        return changed

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM cells").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

