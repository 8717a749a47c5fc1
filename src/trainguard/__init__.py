"""trainguard keeps GPU training jobs alive: it names why a job died, with the evidence and the fix,
and restarts it from its latest checkpoint."""

__version__ = "0.1.0"

__all__ = ["__version__"]
