"""hermes_core: the Hermes agent library (no Prefect import here)."""
