"""numba layer kernels (forward and backward side by side) and optimizer updates; no MPI, no h5py."""
