"""request attempt: llm_requests keeps one body per request, keyed by its first attempt

A decision that failed validation is asked again with a different body (the bad reply
and a correction appended) under the same node: keyed by (batch, ticker, node, sample)
alone, that body was dropped as a duplicate and a replay could not send it.

Revision ID: 0005_request_attempt
Revises: 0004_context_trim
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_request_attempt"
down_revision = "0004_context_trim"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows stored before this revision are each the node's first request: attempt 1.
    # Batch mode: SQLite cannot change a unique constraint in place (PostgreSQL ALTERs).
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=False,
                                      server_default="1"))
        batch_op.drop_constraint("uq_llm_requests_call", type_="unique")
        batch_op.create_unique_constraint(
            "uq_llm_requests_attempt", ["batch_id", "ticker", "node", "sample", "attempt"])


def downgrade() -> None:
    # Only each node's first body fits the old key; the re-asks' bodies go.
    op.execute("DELETE FROM llm_requests WHERE attempt <> 1")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_constraint("uq_llm_requests_attempt", type_="unique")
        batch_op.create_unique_constraint(
            "uq_llm_requests_call", ["batch_id", "ticker", "node", "sample"])
        batch_op.drop_column("attempt")
