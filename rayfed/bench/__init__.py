"""`rayfed bench`: named workloads timed against a plain single-process PyTorch loop."""
