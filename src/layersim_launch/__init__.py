"""`layersim launch`: the DVC pipeline's stages and matrix items as Ray tasks, DVC still in charge.

Apart from the library (`layersim`, which knows nothing of DVC): this package reads DVC's stage graph and
runs `dvc repro` per node. Needs the `ray` extra: `pip install -e .[ray]`."""
