"""Package discovery only; metadata lives in pyproject.toml.

`kernels/` is mapped to `fastdiff.kernels` (see package-dir in pyproject.toml),
which `packages.find` cannot express, so the list is built here.
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["fastdiff", "fastdiff.*"]) + ["fastdiff.kernels"])
