"""The unit files, shipped as package data: `pairmq install` reads them with importlib.resources."""
