"""One orchestration module per pipeline stage: read the stage's inputs, compute through the pure-math
packages (layersim.similarity, layersim.align), summarise (layersim.reporting) and write."""
