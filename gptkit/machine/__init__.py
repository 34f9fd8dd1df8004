"""The machine: the device and processes, timing, the start-up choices and this machine's wisdom, the speed
stand-ins, FLOPs."""
