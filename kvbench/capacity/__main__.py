"""`python -m kvbench.capacity [overrides]`: the same as `kvbench-plan`."""

from kvbench.capacity.cli import main

if __name__ == "__main__":
    main()
