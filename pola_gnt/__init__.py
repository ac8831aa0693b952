"""Pola-GNT: GNT with polarity-aware linear attention."""

__version__ = "0.1.0"
