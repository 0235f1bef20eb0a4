"""Deprecated: kvbench.plan moved to the kvbench.capacity package (issue 35). Import from there.

Re-exports the old names so older code keeps importing; `python -m kvbench.plan` still runs kvbench-plan.
"""

from kvbench.capacity import (  # noqa: F401
    MiB,
    Node,
    check,
    headroom,
    main,
    node_of,
    placed_shape,
    placement,
    plan,
    plan_policies,
    preflight,
    prepare,
    prompt_lengths,
    spec_of,
    table,
    trial,
    window_credit,
)

if __name__ == "__main__":
    main()
