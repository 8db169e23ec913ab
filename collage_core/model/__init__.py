"""The model: a file or module imported into one canonical Relax module, rewritten, at its precision, and checked against its reference."""
