"""What every benchmark prints first: the machine and software it ran on."""

import os
import platform
import sys


def environment() -> str:
    import numpy
    try:
        import ortools
        ort = ortools.__version__
    except Exception:  # ortools missing or without a version: say so
        ort = "not installed"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            cpu = f"{names[0]} x {len(names)}"
    except OSError:
        pass
    return (f"environment: python {platform.python_version()}, numpy {numpy.__version__}, ortools {ort}, "
            f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; argv {' '.join(sys.argv)}")
