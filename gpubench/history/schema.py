"""The history's tables (SQLAlchemy Core). A change here is a new Alembic migration in
``migrations/versions`` as well: the migrations, not this module, create and upgrade a
database; a test checks that the two agree.

The names read naturally in plain SQL (docs/history.md has worked queries): every key is
``<table>_pk`` and a foreign key has the name of the key it points to, so ``machines NATURAL
JOIN runs NATURAL JOIN results`` joins on machine_pk and run_pk alone (no other column name is
shared: a test checks it); ``runs.run_id`` is the run's name, ``runs.git_commit`` the commit
under test."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# one row per machine: the identity (machine_key) hashes what does not change when drivers or
# frameworks are upgraded (host, CPU model, GPU UUIDs); the rest is what was last seen
machines = sa.Table(
    "machines", metadata,
    sa.Column("machine_pk", sa.Integer, primary_key=True),
    sa.Column("machine_key", sa.String(40), nullable=False, unique=True),
    sa.Column("hostname", sa.String(255), nullable=False),
    sa.Column("cpu_model", sa.String(255), nullable=False),
    sa.Column("gpu_model", sa.String(255)),
    sa.Column("gpu_uuids", sa.Text),
    sa.Column("driver", sa.String(64)),
    sa.Column("first_seen", sa.String(32), nullable=False),
)

# one row per run directory: run_key identifies it wherever it is recorded from (run.json's
# run_uuid; a run.json from before run_uuid: a hash of hostname, run id and creation time), so
# recording a run while it runs and ingesting its directory later add it once
runs = sa.Table(
    "runs", metadata,
    sa.Column("run_pk", sa.Integer, primary_key=True),
    sa.Column("run_key", sa.String(40), nullable=False, unique=True),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("suite", sa.String(255), nullable=False),
    sa.Column("machine_pk", sa.Integer, sa.ForeignKey("machines.machine_pk"), nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("finished_at", sa.String(32)),
    sa.Column("complete", sa.Boolean, nullable=False),
    sa.Column("git_commit", sa.String(64)),
    sa.Column("branch", sa.String(255)),
    sa.Column("commit_time", sa.String(32)),
    sa.Column("ci_url", sa.Text),
    sa.Column("tags", sa.JSON, nullable=False),
    sa.Column("env", sa.JSON, nullable=False),
    sa.Column("recorded_at", sa.String(32), nullable=False),
    # a hash of what run.json says of the run when it is made (store.run_digest): two runs with
    # one run_key (run.json files from before run_uuid) are refused, not merged
    sa.Column("run_digest", sa.String(40)),
    sa.Index("ix_runs_suite_created", "suite", "created_at"),
    sa.Index("ix_runs_machine", "machine_pk"),
)

# one row per config repeat; doc is the whole result line as results.jsonl has it, figures every
# finite numeric figure of the metric registry in it ({name: value}: a metric added to the
# registry is stored from then on, with no change to the schema)
results = sa.Table(
    "results", metadata,
    sa.Column("result_pk", sa.Integer, primary_key=True),
    sa.Column("run_pk", sa.Integer, sa.ForeignKey("runs.run_pk", ondelete="CASCADE"), nullable=False),
    sa.Column("config_id", sa.String(255), nullable=False),
    sa.Column("config_hash", sa.String(64)),
    sa.Column("repeat", sa.Integer, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("workload", sa.String(128)),
    sa.Column("framework", sa.String(64)),
    sa.Column("device", sa.String(64)),
    sa.Column("precision", sa.String(32)),
    sa.Column("batch_size", sa.Integer),
    sa.Column("figures", sa.Text, nullable=False),  # a JSON object, encoded where the row is made
    sa.Column("doc", sa.Text, nullable=False),
    sa.UniqueConstraint("run_pk", "config_id", "repeat", name="uq_results_run_config_repeat"),
    sa.Index("ix_results_config", "config_id"),
)
