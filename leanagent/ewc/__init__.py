"""Elastic Weight Consolidation: the penalty and the Fisher files it reads."""
