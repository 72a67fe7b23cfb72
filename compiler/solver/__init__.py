"""The layout solver: enumerate the space, bound it, cost the survivors, rank, explain.

``solve(problem, *, top_k=None) -> Plan`` (compiler.solver.search) is the entry point;
``candidates`` defines the space, ``feasibility`` the rules with their reason codes,
``bounds`` the lower bounds used for pruning, ``explain`` the words.
"""
from compiler.solver.search import solve

__all__ = ["solve"]
