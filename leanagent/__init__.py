"""Premise retrieval for Lean with lifelong learning (LeanAgent/ReProver), as one LightningCLI app."""

__version__ = "0.1.0"
