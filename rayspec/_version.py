"""rayspec's version: a leaf every package may import."""

__version__ = "0.1.0"
