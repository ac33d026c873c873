"""node outputs: each node's text per ticker and sample, for the web page's ticker view

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "node_outputs",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("batch_id", BigId, nullable=False),
        sa.Column("ticker", sa.String(length=12), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("batch_id", "ticker", "sample", "node", name="uq_node_outputs_node"),
    )
    with op.batch_alter_table("node_outputs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_outputs_batch_id"), ["batch_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("node_outputs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_outputs_batch_id"))
    op.drop_table("node_outputs")
