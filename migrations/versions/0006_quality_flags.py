"""quality: decisions flag a rating that contradicts its score; batches get warnings

Revision ID: 0003_quality
Revises: 0005_request_attempt
"""

import sqlalchemy as sa
from alembic import op

# Released as "0003_quality" right after 0003; the chain now runs 0003, 0004_context_trim,
# 0005_request_attempt, this. The id stays, since databases are stamped with it:
# app/db/engine.py brings one stamped before the reordering through the two revisions
# it skipped.
revision = "0003_quality"
down_revision = "0005_request_attempt"
branch_labels = None
depends_on = None

# The bands as they stood when this revision was written (agents/decision.py SCORE_BANDS):
# a migration is a frozen record, so it never imports code that may change later.
BANDS = {
    "Buy": (0.5, 1.0),
    "Overweight": (0.15, 0.5),
    "Hold": (-0.15, 0.15),
    "Underweight": (-0.5, -0.15),
    "Sell": (-1.0, -0.5),
}


def upgrade() -> None:
    # Nullable: a row written by a client that does not know the bands has no verdict.
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("contradicts", sa.Boolean(), nullable=True))
    decisions = sa.table("decisions", sa.column("rating", sa.String()),
                         sa.column("score", sa.Float()), sa.column("contradicts", sa.Boolean()))
    for rating, (low, high) in BANDS.items():
        op.execute(decisions.update().where(decisions.c.rating == rating).values(
            contradicts=sa.not_(decisions.c.score.between(low, high))))

    op.create_table(
        "batch_warnings",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("batch_warnings", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_batch_warnings_batch_id"), ["batch_id"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("batch_warnings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_batch_warnings_batch_id"))
    op.drop_table("batch_warnings")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_column("contradicts")
