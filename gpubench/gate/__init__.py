"""The regression gate: compare distributions of per-process repeats, config by config."""

# the gate's defaults, declared once for every command that gates or uses the gate's figures
# (here, where importing them costs nothing: the pytest plugin reads them as pytest starts)
THRESHOLD, NOISE_FLOOR, ALPHA = "3%", "1%", 0.01
