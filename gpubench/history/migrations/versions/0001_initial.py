"""The first history schema: machines, runs and results.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "machines",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("machine_key", sa.String(40), nullable=False, unique=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("cpu_model", sa.String(255), nullable=False),
        sa.Column("gpu_model", sa.String(255)),
        sa.Column("gpu_uuids", sa.Text),
        sa.Column("driver", sa.String(64)),
        sa.Column("first_seen", sa.String(32), nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_key", sa.String(40), nullable=False, unique=True),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("suite", sa.String(255), nullable=False),
        sa.Column("machine_id", sa.Integer, sa.ForeignKey("machines.id"), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("finished_at", sa.String(32)),
        sa.Column("complete", sa.Boolean, nullable=False),
        sa.Column("commit", sa.String(64)),
        sa.Column("branch", sa.String(255)),
        sa.Column("commit_time", sa.String(32)),
        sa.Column("ci_url", sa.Text),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("recorded_at", sa.String(32), nullable=False),
    )
    op.create_index("ix_runs_suite_created", "runs", ["suite", "created_at"])
    op.create_index("ix_runs_machine", "runs", ["machine_id"])
    op.create_table(
        "results",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
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
        sa.Column("figures", sa.Text, nullable=False),
        sa.Column("doc", sa.Text, nullable=False),
        sa.UniqueConstraint("run_id", "config_id", "repeat", name="uq_results_run_config_repeat"),
    )
    op.create_index("ix_results_config", "results", ["config_id"])


def downgrade() -> None:
    for table in ("results", "runs", "machines"):
        op.drop_table(table)
