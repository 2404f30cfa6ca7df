"""Alembic's environment for the history's migrations, run in-process by gpubench.history.db
on the connection it passes (``config.attributes["connection"]``); there is no alembic.ini."""

from __future__ import annotations

from alembic import context

from gpubench.history.schema import metadata

connection = context.config.attributes["connection"]
# batch mode: SQLite alters a table by copying it, which later migrations may need
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
