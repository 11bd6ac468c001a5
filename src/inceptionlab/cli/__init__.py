"""Command-line interface: a thin skin over the library, one module per command group.

The Typer app and the `inceptionlab` program live in `app.py`; this package file imports nothing,
so the command modules (which import `options.py` beside them) and the package form no import cycle.
"""
