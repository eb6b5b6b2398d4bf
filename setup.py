"""Package discovery: every package under ``jaxfit/`` is found, none is listed by hand.

Two folders of the repository ship inside the package as data: ``configs/`` (the built-in example
configs and the queue files) as ``jaxfit.configs``, and ``scripts/`` (the example training script)
as ``jaxfit.scripts``; ``jaxfit examples --copy DIR`` writes them out. Everything else is in
``pyproject.toml``.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {"jaxfit.configs": "configs", "jaxfit.scripts": "scripts"}

setup(packages=[*find_packages(include=["jaxfit", "jaxfit.*"]), *DATA_PACKAGES], package_dir=DATA_PACKAGES)
