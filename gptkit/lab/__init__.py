"""The attention lab: a ladder of models trained side by side."""
