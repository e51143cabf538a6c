"""Datasets in one HDF5 layout: converters, a synthetic generator and the per-worker reader."""
from psgd.data.layout import write_dataset
from psgd.data.reader import ShardReader, dataset_info, slice_bounds
from psgd.data.synth import make_synthetic

__all__ = ["ShardReader", "dataset_info", "make_synthetic", "slice_bounds", "write_dataset"]
