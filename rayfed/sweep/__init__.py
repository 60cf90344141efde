"""`rayfed sweep`: a grid of configs run as Ray Tune trials, each an ordinary run directory."""
