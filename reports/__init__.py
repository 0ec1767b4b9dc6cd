"""Presentations of an analysis for people: the terminal summary (and the HTML report)."""
