"""request time split: server_samples keeps vLLM's prefill and decode seconds

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = ("prefill_time_s_total", "decode_time_s_total")


def upgrade() -> None:
    # Nullable: rows sampled before this revision, and older servers, have no figure.
    for name in COLUMNS:
        op.add_column("server_samples", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    # SQLite before 3.35 cannot DROP COLUMN: batch mode copies the table there.
    with op.batch_alter_table("server_samples", schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
