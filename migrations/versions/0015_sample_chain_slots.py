"""chain_slots: the tickers whose chains the token budget kept going at a server reading

Revision ID: 0015_sample_chain_slots
Revises: 0014_served_by
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_sample_chain_slots"
down_revision = "0014_served_by"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: no budget (no gauges, or a strategy without one), and rows stored before.
    with op.batch_alter_table("server_samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chain_slots", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("server_samples", schema=None) as batch_op:
        batch_op.drop_column("chain_slots")
