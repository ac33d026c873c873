"""scheduler heartbeats: the scheduler daemon's latest sign of life, one row per host

Revision ID: 0009_scheduler_heartbeats
Revises: 0008_client_lag
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_scheduler_heartbeats"
down_revision = "0008_client_lag"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_heartbeats",
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("schedule", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("host"),
    )


def downgrade() -> None:
    op.drop_table("scheduler_heartbeats")
