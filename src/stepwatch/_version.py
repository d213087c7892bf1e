"""The version of stepwatch (read by the build backend)."""

__version__ = "0.1.0"
