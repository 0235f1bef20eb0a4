"""Hydra configs of kvbench (shipped inside the package as kvbench.conf)."""
