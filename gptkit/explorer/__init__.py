"""The explorer: a local web page over trained runs."""
