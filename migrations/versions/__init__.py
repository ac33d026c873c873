"""One module per schema revision (Alembic skips this file when it reads the chain)."""
