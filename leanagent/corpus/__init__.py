"""Tactic-state corpora in the LeanDojo Benchmark 4 layout: premises, files, imports, tactic states."""
