"""Column names that read naturally in plain SQL.

``runs."commit"`` needed quoting (COMMIT is an SQL keyword), and ``run_id`` was the text name
in ``runs`` but the integer key in ``results``, so ``runs NATURAL JOIN results`` matched on
both ``id`` and ``run_id`` and returned nothing. Now every key is ``<table>_pk`` and a foreign
key has the name of the key it points to: ``runs NATURAL JOIN results`` joins on run_pk alone,
``machines NATURAL JOIN runs`` on machine_pk alone, and ``runs.run_id`` stays the run's name.

Plain ``ALTER TABLE ... RENAME COLUMN`` (SQLite 3.25 and later, PostgreSQL): both rename the
column in place and update the foreign keys and indexes that name it. Not Alembic's batch mode:
on SQLite it copies a table and drops the original, and with foreign keys on, dropping ``runs``
would delete every result (ON DELETE CASCADE). PostgreSQL's constraint and sequence names,
which spell the old column names, are renamed too.

And ``runs.run_digest``: a hash of what run.json says of the run when it is made (suite, args,
creation time, tags), so that two runs with one key (run.json files from before ``run_uuid``,
of one suite, started in the same second on one host) are told apart even where they share no
config repeat, instead of being merged into one run.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlite3

import sqlalchemy as sa
from alembic import op

from gpubench.history.db import HistoryError

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# (table, old name, new name), applied in this order (and reversed by the downgrade)
RENAMES = (
    ("machines", "id", "machine_pk"),
    ("runs", "id", "run_pk"),
    ("runs", "machine_id", "machine_pk"),
    ("runs", "commit", "git_commit"),
    ("results", "id", "result_pk"),
    ("results", "run_id", "run_pk"),
)
# PostgreSQL's names for the constraints and sequences made by 0001 (old, new)
PG_CONSTRAINTS = (
    ("runs", "runs_machine_id_fkey", "runs_machine_pk_fkey"),
    ("results", "results_run_id_fkey", "results_run_pk_fkey"),
)
PG_SEQUENCES = (
    ("machines_id_seq", "machines_machine_pk_seq"),
    ("runs_id_seq", "runs_run_pk_seq"),
    ("results_id_seq", "results_result_pk_seq"),
)


def _name(column: str) -> str:
    """Quoted where it is a keyword (only "commit" is), so that SQLite keeps its table
    definitions unquoted elsewhere."""
    return f'"{column}"' if column == "commit" else column


def _rename_column(table: str, old: str, new: str) -> None:
    op.execute(f"ALTER TABLE {table} RENAME COLUMN {_name(old)} TO {_name(new)}")


def _pg_names(forward: bool) -> None:
    """PostgreSQL's constraint and sequence names, where they have the names 0001 gave them."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for table, old, new in PG_CONSTRAINTS:
        src, dst = (old, new) if forward else (new, old)
        found = bind.execute(sa.text("SELECT 1 FROM pg_constraint WHERE conname = :name "
                                     "AND conrelid = to_regclass(:table)"), {"name": src, "table": table}).first()
        if found:
            op.execute(f'ALTER TABLE {table} RENAME CONSTRAINT "{src}" TO "{dst}"')
    for old, new in PG_SEQUENCES:
        src, dst = (old, new) if forward else (new, old)
        found = bind.execute(sa.text("SELECT to_regclass(:name)::text"), {"name": src}).scalar()
        if found is not None:
            op.execute(f'ALTER SEQUENCE "{src}" RENAME TO "{dst}"')


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 25, 0):
        raise HistoryError(f"the history's schema revision 0003 renames columns, which needs SQLite 3.25 or later; "
                           f"this Python has SQLite {sqlite3.sqlite_version}")
    for table, old, new in RENAMES:
        _rename_column(table, old, new)
    _pg_names(forward=True)
    op.add_column("runs", sa.Column("run_digest", sa.String(40)))


def downgrade() -> None:
    op.drop_column("runs", "run_digest")  # SQLite 3.35 and later
    _pg_names(forward=False)
    for table, old, new in reversed(RENAMES):
        _rename_column(table, new, old)
