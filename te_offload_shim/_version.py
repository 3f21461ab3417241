"""The package's version, its one source (pyproject.toml reads it here; the package exports it)."""

__version__ = "0.8.0.dev0"
