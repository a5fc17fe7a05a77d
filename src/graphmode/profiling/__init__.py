"""Measuring half of graphmode: start vLLM per mode, drive workloads, record what was observed."""
