"""Interpretability: hook points by name, experiments on a trained model, and pictures of runs and heads."""
