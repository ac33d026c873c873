"""endpoints: which server a usage row and a /metrics sample came from

Revision ID: 0007_endpoint
Revises: 0003_quality
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_endpoint"
down_revision = "0003_quality"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: rows written before a batch could have several endpoints name none.
    for table in ("llm_calls", "server_samples"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("endpoint", sa.String(length=300), nullable=True))


def downgrade() -> None:
    for table in ("server_samples", "llm_calls"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("endpoint")
