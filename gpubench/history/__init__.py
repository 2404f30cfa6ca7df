"""The results history: every run remembered by commit and machine, in SQLite (a file, the
default) or PostgreSQL (a server, for teams), through one code path (SQLAlchemy Core, the
schema versioned by Alembic migrations).

What is stored: each run (its provenance: commit, branch, commit time, CI link, suite, tags;
whether it completed), the machine it ran on (a stable identity from host, CPU model and GPU
UUIDs), and each result whole (its result line, from which the gate's per-repeat figures come
back) with every numeric figure of the metric registry in a table of its own for queries.

Needs the ``history`` extra (SQLAlchemy, Alembic, orjson; ``postgresql`` adds the PostgreSQL
driver, psycopg); nothing else in gpubench imports it unless a command asks for a database.
"""
