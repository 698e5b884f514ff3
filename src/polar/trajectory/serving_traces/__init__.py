"""A capture store as serving traces (``polar capture export``): one module per format."""
