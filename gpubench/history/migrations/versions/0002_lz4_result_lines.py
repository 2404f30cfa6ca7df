"""PostgreSQL: result lines compressed with lz4 instead of pglz.

A result line (a few KB) is stored compressed out of line, and compressing it with pglz was
most of the server's work in an ingest; lz4 does it in a fraction of the time for a little more
space (benchmarks/history_scale.py measures both). Servers from PostgreSQL 14 that were built with lz4 (Debian's and the
official images are) take it; others keep pglz. SQLite stores lines uncompressed: nothing to do.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or (bind.dialect.server_version_info or (0,)) < (14,):
        return
    try:
        with bind.begin_nested():  # a server without lz4 refuses it: keep pglz
            op.execute("ALTER TABLE results ALTER COLUMN doc SET COMPRESSION lz4")
    except sa.exc.DBAPIError:
        pass


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql" and (bind.dialect.server_version_info or (0,)) >= (14,):
        op.execute("ALTER TABLE results ALTER COLUMN doc SET COMPRESSION pglz")
