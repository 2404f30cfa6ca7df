"""Reports: tables, PNG charts, a self-contained HTML page, CSV and markdown."""
