"""Solvers: building blocks used by the methods (no registration here)."""
