"""The one cost model: compute, memory, collectives, step time, reliability, calibration."""
