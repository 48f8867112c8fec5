"""Numerical building blocks every layer may use: linear algebra, devices and precision, means over runs, the
optimiser step loop."""
