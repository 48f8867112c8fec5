"""`python -m layersim.params` prints docs/params.md."""

from layersim.params import describe

print(describe(), end="")
