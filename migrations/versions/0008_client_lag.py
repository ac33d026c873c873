"""client lag: how far behind its own schedule the client's event loop was at each reading

Revision ID: 0008_client_lag
Revises: 0007_endpoint
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_client_lag"
down_revision = "0007_endpoint"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: readings taken before it was measured have none.
    with op.batch_alter_table("server_samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("client_lag_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("server_samples", schema=None) as batch_op:
        batch_op.drop_column("client_lag_s")
