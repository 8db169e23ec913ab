"""Counting a test plugin's attempts at something in files, so that every worker process counts."""

import os
from pathlib import Path


def attempt(variable: str, name: str) -> int:
    """This attempt's number for ``name`` (1 for the first), kept in the folder ``$variable`` names."""
    folder = Path(os.environ[variable])
    number = 1
    while True:
        try:
            (folder / f"{name}-{number}").touch(exist_ok=False)
            return number
        except FileExistsError:
            number += 1
