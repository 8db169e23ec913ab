"""Errors Collage reports to users."""


class CollageError(Exception):
    """An error with a one-line message meant for the user."""
