"""graphmode: pick the right vLLM CUDA Graph mode for the traffic a deployment actually sees."""

__version__ = "0.1.0"
