"""How sure a similarity value is: the inference machinery, apart from the measures it judges.

Every module here takes a measure by name (``layersim.similarity.registry``) and says what chance gives and how
far a value can be trusted; none defines a measure. By question:

* What would chance give? :mod:`~layersim.similarity.inference.null` — permutation nulls and p-values for every
  measure (``permutation_test``, ``permutation_matrix``); :mod:`~layersim.similarity.inference._rv` — linear CKA's
  null from its exact permutation moments (independent rows only); :mod:`~layersim.similarity.inference.rotation_null`
  — the same from streamed second moments, rows rotated instead of shuffled;
  :mod:`~layersim.similarity.inference._null_engines` — the per-measure fast paths a null draws through.
* Which rows may a null move? :mod:`~layersim.similarity.inference.exchangeability` — whole examples permuted
  among examples of the same size (Winkler et al. 2015's exchangeability blocks), within strata such as a task.
* How many cells were tested? :mod:`~layersim.similarity.inference.correction` — Holm and Benjamini–Hochberg
  over a family of cells.
* How far would the value move with other examples? :mod:`~layersim.similarity.inference.bootstrap` and
  :mod:`~layersim.similarity.inference.bootstrap_matrix` — intervals from resampling whole examples, with the
  interval method each measure's measured coverage allows.
* How far with another fine-tuning seed? :mod:`~layersim.similarity.inference.seeds` — seeds as the unit of
  uncertainty (t-intervals clipped to the measure's range).
"""
