"""graphmode: pick the right vLLM CUDA Graph mode for the traffic a deployment actually sees."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("graphmode")
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"
