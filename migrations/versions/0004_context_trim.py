"""context trim: llm_calls says when the context guard shrank a prompt, and by how much

Revision ID: 0004_context_trim
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_context_trim"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL means the prompt went out whole; rows written before this revision were never cut.
    op.add_column("llm_calls", sa.Column("context_trimmed_tokens", sa.Integer(), nullable=True))
    op.add_column("llm_calls", sa.Column("context_trimmed", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("context_trimmed")
        batch_op.drop_column("context_trimmed_tokens")
