"""Installed versions, read without importing the packages (jax is never imported here)."""

from __future__ import annotations

import importlib.metadata


def installed_version(distribution: str, default: str = "unknown") -> str:
    """The installed version of ``distribution``, or ``default`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return default


def jaxfit_version() -> str:
    """This jaxfit's version (``0+unknown`` when run from a checkout that is not installed)."""
    return installed_version("jaxfit", "0+unknown")


def jax_version() -> str:
    """The installed jax's version, as this process would import it."""
    return installed_version("jax")
