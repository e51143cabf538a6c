"""Elastic asynchronous training: a server job that workers (each its own MPI job) join and leave."""
