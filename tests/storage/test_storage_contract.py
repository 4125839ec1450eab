"""The contract of spectune's storage, run against every backend: SQLite (a file of this test's
own) and PostgreSQL (the machine's server, a database of this test's own)."""

from __future__ import annotations

import threading
import time
import warnings

import optuna
import pytest
import sqlalchemy as sa
from conftest import REPO

from spectune.errors import StorageError
from spectune.landscape import Landscape
from spectune.measurement import Measurement
from spectune.storage import MeasurementStore, open_optuna_storage, study_lock


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path) -> str:  # noqa: ANN001
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'contract.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="module")
def measurement() -> Measurement:
    landscape = Landscape.load(REPO / "benchmarks" / "landscapes" / "tiny_one_start.json")
    return next(p.measurement for p in landscape.points if p.measurement is not None)


def test_a_trial_is_recorded_once_and_read_back(url: str, measurement: Measurement) -> None:
    store = MeasurementStore(url)
    store.record(study_name="s", trial_id=7, trial_number=0, spec_key="k", error="engine exited")
    store.record(study_name="s", trial_id=7, trial_number=0, spec_key="k", measurement=measurement)  # replaces
    store.record(study_name="s", trial_id=9, trial_number=1, spec_key="k2", error="engine exited")
    store.record(study_name="other", trial_id=11, trial_number=0, spec_key="k", error="x")
    rows = store.trials("s")
    assert [(r.trial_number, r.state) for r in rows] == [(0, "COMPLETE"), (1, "FAIL")]
    assert store.trial_ids("s") == {0: 7, 1: 9}
    assert store.measurement(7) == measurement and store.measurement(9) is None and store.measurement(None) is None
    assert rows[1].error == "engine exited"


def test_a_study_definition_round_trips_and_is_replaced(url: str) -> None:
    store = MeasurementStore(url)
    assert store.definition("s") is None
    store.save_definition("s", {"config": {"trials": 3}, "prompts": [{"id": "a", "text": "é"}]})
    store.save_definition("s", {"config": {"trials": 5}, "prompts": []})
    assert MeasurementStore(url).definition("s") == {"config": {"trials": 5}, "prompts": []}


def test_a_database_of_a_newer_schema_is_refused(url: str) -> None:
    MeasurementStore(url)
    with sa.create_engine(url).begin() as conn:
        assert conn.execute(sa.text("SELECT value FROM spectune_meta WHERE key = 'schema_version'")).scalar() == "1"
        conn.execute(sa.text("UPDATE spectune_meta SET value = '2' WHERE key = 'schema_version'"))
    with pytest.raises(StorageError, match="schema version 2"):
        MeasurementStore(url)


def test_the_study_lock_lets_one_holder_in_at_a_time(url: str) -> None:
    MeasurementStore(url)  # the database exists
    events: list[tuple[str, int]] = []

    def hold(i: int) -> None:
        for _ in range(3):
            with study_lock(url, "s"):
                events.append(("in", i))
                time.sleep(0.05)
                events.append(("out", i))

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(events) == 18
    assert all(a[0] == "in" and b == ("out", a[1]) for a, b in zip(events[::2], events[1::2], strict=True))
    with study_lock(url, "s"), study_lock(url, "another study"):  # studies do not wait for each other
        pass


def test_a_silent_trial_is_failed_by_its_heartbeat_and_queued_again(url: str) -> None:
    storage = open_optuna_storage(url, heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="beats", storage=storage)
    trial = study.ask()
    storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("beats"), trial.number))
    time.sleep(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    states = [t.state.name for t in study.get_trials()]
    assert states == ["FAIL", "WAITING"]  # failed, and a copy queued for the next worker that asks
