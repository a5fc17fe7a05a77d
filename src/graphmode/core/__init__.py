"""What profiling, the selector, the service and control all stand on: records, the dataset store, modes,
settings, the error tree and fingerprints. Nothing here imports from the packages above it."""
