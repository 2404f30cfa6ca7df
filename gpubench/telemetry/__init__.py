"""Telemetry: GPU (NVML) and host samplers."""
