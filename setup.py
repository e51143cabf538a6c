"""The one thing pyproject.toml cannot say: the top-level kernels/ installs as psgd.kernels.

Every other package is found automatically (setuptools' find_packages), so a new
subpackage of psgd/ or kernels/ needs no entry here; tests/test_packaging.py checks the wheel.
"""
from setuptools import find_packages, setup

setup(
    packages=(find_packages(include=["psgd", "psgd.*"])
              + ["psgd.kernels"] + [f"psgd.kernels.{p}" for p in find_packages("kernels")]),
    package_dir={"psgd.kernels": "kernels"},
)
