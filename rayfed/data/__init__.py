"""Datasets and their split among clients."""
from rayfed.data.datasets import DATASETS, Dataset, load_dataset, missing_files
from rayfed.data.partition import Partition, class_histogram, make_partition, write_histogram_csv

__all__ = ["DATASETS", "Dataset", "load_dataset", "missing_files",
           "Partition", "class_histogram", "make_partition", "write_histogram_csv"]
