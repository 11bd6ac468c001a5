"""Placeholder: replaced by the real command group."""
import typer

app = typer.Typer()


def register(root: typer.Typer) -> None:
    pass
