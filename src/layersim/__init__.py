"""layersim: how fine-tuning changes the layers of transformer encoders.

Layers of the library (a lower one never imports a higher one):
1. ``layersim.similarity`` — pure math on arrays.
2. ``layersim.tasks``, ``layersim.models`` — registries: what a short name means, and loading.
3. ``layersim.encoders`` — running an encoder layer by layer.
4. ``layersim.train``, ``layersim.extract``, ``layersim.evaluate``, ``layersim.io`` — stage work.
"""

__version__ = "0.1.0"
