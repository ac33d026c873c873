"""failure class: a failed ticker says whose failure it was

``ticker_runs`` gains ``failure_class``: "own" (the ticker's answer, data or prompt) or
"infrastructure" (the server or the database), so that ``run --resume`` takes up the tickers
the infrastructure cost and leaves the others failed. Rows stored before this revision keep
NULL, which reads as their own: they were finished for good when they were stored.

Revision ID: 0012_failure_class
Revises: 0011_call_id
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_failure_class"
down_revision = "0011_call_id"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ticker_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failure_class", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ticker_runs", schema=None) as batch_op:
        batch_op.drop_column("failure_class")
