"""Alembic's environment for the history's migrations, run in-process by gpubench.history.db
on the connection it passes (``config.attributes["connection"]``); there is no alembic.ini."""

from __future__ import annotations

from alembic import context

from gpubench.history.schema import metadata

connection = context.config.attributes["connection"]
# no batch mode: on SQLite it alters a table by copying it and dropping the original, and with
# foreign keys on, dropping runs would delete every result (ON DELETE CASCADE). A migration uses
# statements both databases run in place (ALTER TABLE ... RENAME COLUMN, ADD COLUMN: 0003)
context.configure(connection=connection, target_metadata=metadata, render_as_batch=False)
with context.begin_transaction():
    context.run_migrations()
