"""served_by: the server behind a router that answered a call, where the router names it

Revision ID: 0014_served_by
Revises: 0013_progress_readings
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_served_by"
down_revision = "0013_progress_readings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: a call sent straight to a server, or through a router that names none.
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("served_by", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("served_by")
