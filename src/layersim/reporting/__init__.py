"""Summaries and figures: plots, the headline metrics, the similarity figures and the report page."""
