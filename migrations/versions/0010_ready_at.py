"""ready_at: when the graph issued a call, before the client's own gate held it

Revision ID: 0010_ready_at
Revises: 0009_scheduler_heartbeats
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_ready_at"
down_revision = "0009_scheduler_heartbeats"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: calls recorded before it was kept, and calls sent outside a batch, have none.
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("ready_at")
