"""psgd: an MPI parameter server, asynchronous/synchronous SGD and ring all-reduce."""
__version__ = "0.1.0"
