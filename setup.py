"""psgd: an MPI parameter server and asynchronous SGD in Python."""
from setuptools import setup

setup(
    name="psgd",
    version="0.1.0",
    description="MPI parameter server, asynchronous/synchronous SGD and ring all-reduce "
                "with numba layer kernels",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=["psgd", "psgd.mpi", "psgd.nn", "psgd.data", "psgd.collectives", "psgd.ps",
              "psgd.hogwild", "psgd.protocols", "psgd.run", "psgd.kernels"],
    package_dir={"psgd": "psgd", "psgd.kernels": "kernels"},
    install_requires=[
        "numpy>=1.24",
        "numba>=0.59",
        "scipy>=1.10",  # numba's np.dot calls BLAS through SciPy
        "h5py>=3.8",
        "mpi4py>=4.0",
        "tqdm>=4.60",
    ],
    extras_require={
        "mpich": ["mpich"],          # an MPI from PyPI, for machines without one
        "plot": ["matplotlib>=3.6"],
        "images": ["Pillow>=9"],   # psgd data convert of image-folder trees
        "test": ["pytest>=7"],
        "peer": ["torch==2.13.0"],  # the PyTorch peer of tests/test_peer_torch.py and bench-peer
    },
    entry_points={"console_scripts": ["psgd=psgd.cli:main_and_exit"]},
)
