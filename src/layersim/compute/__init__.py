"""Numerical building blocks every layer may use: linear algebra, devices and precision, the
optimiser step loop."""
