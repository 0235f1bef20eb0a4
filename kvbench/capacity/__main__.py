"""`python -m kvbench.capacity [overrides]`: the same as `kvbench-plan`."""

from kvbench.capacity.plan_cli import main

if __name__ == "__main__":
    main()
