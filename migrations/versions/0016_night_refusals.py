"""night_refusals: a night refused at its start, so the morning names why it is stale

Revision ID: 0016_night_refusals
Revises: 0015_sample_chain_slots
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_night_refusals"
down_revision = "0015_sample_chain_slots"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "night_refusals",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("refused_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("as_of", sa.Date(), nullable=True),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("why", sa.Text(), nullable=False),
        sa.Column("advice", sa.Text(), nullable=False),
        sa.Column("command", sa.String(length=500), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_night_refusals_refused_at", "night_refusals", ["refused_at"])


def downgrade() -> None:
    op.drop_index("ix_night_refusals_refused_at", table_name="night_refusals")
    op.drop_table("night_refusals")
