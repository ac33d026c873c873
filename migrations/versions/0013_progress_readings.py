"""progress readings: a running batch's ETA and the inputs it came from, at each reading

Revision ID: 0013_progress_readings
Revises: 0012_failure_class
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_progress_readings"
down_revision = "0012_failure_class"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "progress_readings",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("calls_expected", sa.Integer(), nullable=False),
        sa.Column("calls_done", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("tokens_left", sa.Float(), nullable=False),
        sa.Column("rate_tok_s", sa.Float(), nullable=True),
        sa.Column("rate_low_tok_s", sa.Float(), nullable=True),
        sa.Column("rate_high_tok_s", sa.Float(), nullable=True),
        sa.Column("rate_source", sa.String(length=16), nullable=True),
        sa.Column("chain_left", sa.Integer(), nullable=False),
        sa.Column("chain_s", sa.Float(), nullable=True),
        sa.Column("chain_low_s", sa.Float(), nullable=True),
        sa.Column("chain_high_s", sa.Float(), nullable=True),
        sa.Column("eta_s", sa.Float(), nullable=True),
        sa.Column("eta_low_s", sa.Float(), nullable=True),
        sa.Column("eta_high_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_progress_readings_batch_id", "progress_readings", ["batch_id"])


def downgrade() -> None:
    op.drop_index("ix_progress_readings_batch_id", table_name="progress_readings")
    op.drop_table("progress_readings")
