"""Planning: search strategies x micro-batch x checkpointing, choose by policy, compare clusters;
``advisor.plan()`` lives in ``api``. No torch import (a test imports this package and checks)."""
