"""The documentation, shipped as package data: the installed units' Documentation= names operations.md here."""
