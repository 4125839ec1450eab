"""Study storage: one place resolves the storage URL and owns spectune's own schema.

Optuna keeps studies and trials (its RDB storage, with heartbeats so that a dead worker's
trial is failed and retried). spectune keeps each trial's full Measurement, or its failure,
in its own table ``spectune_trials`` in the same database, linked by study name and trial id.
SQLite under ``storage/`` by default; PostgreSQL (``postgresql+psycopg://...``) when several
machines work on one study.

A running worker reaches its storage through one :class:`StorageGuard`, which carries its calls
through an outage (PostgreSQL down or restarting, a SQLite file locked by another process): it
tries them again with backoff until the storage answers, or until the worker's
``storage_outage_limit`` has passed (:class:`~spectune.errors.StorageUnreachableError`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from spectune.errors import StorageError
from spectune.storage._guard import DEFAULT_OUTAGE_LIMIT, StorageGuard, is_transient
from spectune.storage._locks import _schema_lock, study_lock, worker_claim
from spectune.storage._urls import (
    DEFAULT_STORAGE,
    _describe,
    _engine,
    _engine_kwargs,
    resolve_storage_url,
    safe_url,
)

if TYPE_CHECKING:
    import optuna

    from spectune.measurement import Measurement

__all__ = [
    "DEFAULT_OUTAGE_LIMIT",
    "DEFAULT_STORAGE",
    "MeasurementStore",
    "StorageGuard",
    "StoredTrial",
    "is_transient",
    "open_optuna_storage",
    "resolve_storage_url",
    "safe_url",
    "study_lock",
    "worker_claim",
]

_logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 30
GRACE_PERIOD = 120

SCHEMA_VERSION = 1
"""Version of spectune's own tables; a database written by a newer spectune is refused."""

_metadata = sa.MetaData()
meta_table = sa.Table(
    "spectune_meta",
    _metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)
studies_table = sa.Table(
    "spectune_studies",
    _metadata,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("definition", sa.Text, nullable=False),
)
"""What a worker on any machine needs to join a study: its configuration, its resolved search
space and its prompts (JSON), so that no file of the machine that created it is read again."""
trials_table = sa.Table(
    "spectune_trials",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("trial_id", sa.Integer, nullable=False, unique=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("spec_key", sa.String(2048), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("measurement", sa.Text, nullable=True),
)


def check_reachable(url: str) -> None:
    """Raise StorageError (one line) unless the database at ``url`` answers."""
    try:
        with _engine(url).connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except (SQLAlchemyError, ImportError, ValueError) as e:
        raise StorageError(_describe(url, e)) from e


def open_optuna_storage(
    url: str, *, retries: int = 1, heartbeat_interval: int = HEARTBEAT_INTERVAL,
    grace_period: int = GRACE_PERIOD,
) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url`` with heartbeats; a stale trial is failed and retried once.

    A worker beats every ``heartbeat_interval`` seconds while a trial runs; a RUNNING trial
    whose last beat is older than ``grace_period`` is failed by the next worker that starts a
    trial, and re-queued.
    """
    import warnings

    import optuna

    check_reachable(url)
    try:
        with _schema_lock(url), warnings.catch_warnings():
            # heartbeats are "experimental" in Optuna since 2.8; they are what distributed mode needs
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            if retry is not None:  # Optuna >= 4.9
                callback = {"heartbeat_stale_trial_callback": retry(max_retry=retries)}
            else:
                callback = {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=retries)}
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                engine_kwargs=_engine_kwargs(url),
                **callback,
            )
    except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as e:
        raise StorageError(_describe(url, e)) from e


@dataclass(frozen=True)
class StoredTrial:
    """One row of spectune's table."""

    study_name: str
    trial_id: int
    trial_number: int
    spec_key: str
    state: str
    error: str | None
    measurement_json: str | None

    def measurement(self) -> Measurement | None:
        from spectune.config import RECORDED
        from spectune.measurement import Measurement

        if self.measurement_json is None:
            return None
        return Measurement.model_validate_json(self.measurement_json, context=RECORDED)


class MeasurementStore:
    """spectune's table of full measurements and failures, beside Optuna's tables.

    Safe to use from several processes and machines at once (each write is one transaction;
    ``trial_id`` is unique, so a trial is recorded once).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = _engine(url)
        try:
            with _schema_lock(url):
                _metadata.create_all(self._engine)
                self._check_schema_version()
        except SQLAlchemyError as e:
            raise StorageError(_describe(url, e)) from e

    def _check_schema_version(self) -> None:
        """Record :data:`SCHEMA_VERSION` in a new database; refuse one written by a newer spectune."""
        with self._engine.begin() as conn:
            stored = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")).scalar()
            if stored is None:
                conn.execute(sa.insert(meta_table).values(key="schema_version", value=str(SCHEMA_VERSION)))
            elif int(stored) > SCHEMA_VERSION:
                raise StorageError(
                    f"storage {safe_url(self.url)} holds spectune tables of schema "
                    f"version {stored}; this spectune reads up to version {SCHEMA_VERSION}: upgrade spectune")

    def record(
        self, *, study_name: str, trial_id: int, trial_number: int, spec_key: str,
        measurement: Measurement | None = None, error: str | None = None,
    ) -> None:
        """Store a trial's measurement (state COMPLETE) or its failure (state FAIL)."""
        row: dict[str, Any] = {
            "study_name": study_name, "trial_id": trial_id, "trial_number": trial_number,
            "created_at": dt.datetime.now(dt.timezone.utc), "spec_key": spec_key,
            "state": "COMPLETE" if measurement is not None else "FAIL", "error": error,
            "measurement": measurement.model_dump_json() if measurement is not None else None,
        }
        self._replace(trials_table, trials_table.c.trial_id == trial_id, row)

    def trials(self, study_name: str) -> list[StoredTrial]:
        """Every stored trial of a study, in trial order."""
        q = sa.select(trials_table).where(trials_table.c.study_name == study_name).order_by(
            trials_table.c.trial_number)
        return [
            StoredTrial(study_name=r.study_name, trial_id=r.trial_id, trial_number=r.trial_number,
                        spec_key=r.spec_key, state=r.state, error=r.error, measurement_json=r.measurement)
            for r in self._rows(q)
        ]

    def save_definition(self, study_name: str, definition: dict[str, Any]) -> None:
        """Store (or replace) what a worker needs to join ``study_name`` (:data:`studies_table`)."""
        row = {"study_name": study_name, "updated_at": dt.datetime.now(dt.timezone.utc),
               "definition": json.dumps(definition)}
        self._replace(studies_table, studies_table.c.study_name == study_name, row)

    def definition(self, study_name: str) -> dict[str, Any] | None:
        """What :meth:`save_definition` stored for ``study_name``, or None (a study of an earlier spectune)."""
        rows = self._rows(sa.select(studies_table.c.definition).where(studies_table.c.study_name == study_name))
        return json.loads(rows[0].definition) if rows else None

    def trial_ids(self, study_name: str) -> dict[int, int]:
        """Trial number -> trial id of the trials of ``study_name`` recorded here (the newest row
        of a number, should a study of that name have been deleted and made again)."""
        q = sa.select(trials_table.c.trial_number, trials_table.c.trial_id).where(
            trials_table.c.study_name == study_name).order_by(trials_table.c.id)
        return {r.trial_number: r.trial_id for r in self._rows(q)}

    def measurement(self, trial_id: int | None) -> Measurement | None:
        """The Measurement of trial ``trial_id``; None when it has none (failed, not run here)."""
        if trial_id is None:
            return None
        rows = self._rows(sa.select(trials_table.c.measurement).where(trials_table.c.trial_id == trial_id))
        if not rows or rows[0].measurement is None:
            return None
        from spectune.config import RECORDED
        from spectune.measurement import Measurement

        return Measurement.model_validate_json(rows[0].measurement, context=RECORDED)

    # -- one place for the transactions and the errors -------------------------------------------
    def _replace(self, table: sa.Table, where: sa.ColumnElement[bool], row: dict[str, Any]) -> None:
        """Delete the rows ``where`` matches and insert ``row``, in one transaction."""
        try:
            with self._engine.begin() as conn:
                conn.execute(sa.delete(table).where(where))
                conn.execute(sa.insert(table).values(**row))
        except SQLAlchemyError as e:
            raise StorageError(_describe(self.url, e)) from e

    def _rows(self, query: sa.Select[Any]) -> list[sa.Row[Any]]:
        try:
            with self._engine.connect() as conn:
                return list(conn.execute(query).all())
        except SQLAlchemyError as e:
            raise StorageError(_describe(self.url, e)) from e


# -- outages: the one place that tries a running worker's storage calls again -------------------

