"""Lifelong learning across Lean repositories, as in LeanAgent (arXiv 2410.06209).

`curriculum` orders repositories by how many easy theorems they hold, `merge` builds the
"Merge All" datasets without leaking earlier test theorems into training, and `metrics`
scores a run's stability and plasticity from its per-stage evaluation matrix.
"""
